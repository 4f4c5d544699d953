//! Fuzz target `sim_scenario`: the properties of [`shim_slice::props::scenario`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shim_slice::props::scenario(data));
