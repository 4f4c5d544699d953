//! Fuzz target `condition_upsert`: the properties of [`shim_slice::props::condition_upsert`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shim_slice::props::condition_upsert(data));
