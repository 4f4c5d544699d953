//! Fuzz target `cloudstack_parse`: the properties of [`fuzz_props::props::parser`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::props::parser(data));
