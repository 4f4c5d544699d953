//! Fuzz target `signing_encoder`: the properties of [`shim_slice::props::signer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shim_slice::props::signer(data));
