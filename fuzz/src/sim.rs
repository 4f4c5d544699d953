//! `crate::sim` of the library: the scenario loader and the world it builds.

#[path = "../../src/sim/catalog.rs"]
pub mod catalog;
#[path = "../../src/sim/scenario.rs"]
pub mod scenario;
#[path = "../../src/sim/traffic.rs"]
pub mod traffic;
#[path = "../../src/sim/world.rs"]
pub mod world;
