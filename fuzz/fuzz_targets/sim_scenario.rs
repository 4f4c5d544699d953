//! Fuzz target `sim_scenario`: the properties of [`fuzz_props::props::scenario`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::props::scenario(data));
