//! Fuzz target `error_envelope`: the properties of [`shim_slice::props::error_envelope`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shim_slice::props::error_envelope(data));
