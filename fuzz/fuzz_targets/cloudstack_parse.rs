//! Fuzz target `cloudstack_parse`: the properties of [`shim_slice::props::parser`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shim_slice::props::parser(data));
