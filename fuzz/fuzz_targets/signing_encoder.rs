//! Fuzz target `signing_encoder`: the properties of [`fuzz_props::props::signer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::props::signer(data));
