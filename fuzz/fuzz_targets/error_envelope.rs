//! Fuzz target `error_envelope`: the properties of [`fuzz_props::props::error_envelope`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::props::error_envelope(data));
