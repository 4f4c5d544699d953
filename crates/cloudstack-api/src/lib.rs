//! The CloudStack API as the shim speaks it: the tolerant wire model ([`model`]), request
//! signing exactly as the server verifies it ([`signing`]), response and error-envelope parsing
//! ([`parse`], [`error`]), the opt-in guest probe's tool output readings ([`diagnostics`]) — all
//! pure — and, behind the `client` feature, the HTTP client with pagination, retries and a rate
//! limit ([`client`], [`ratelimit`]).
//!
//! The pure half has no async runtime or HTTP stack in its dependency tree, so the simulator
//! and the fuzz targets can use it without compiling `reqwest` or `tokio`.

pub mod diagnostics;
pub mod error;
pub mod model;
pub mod parse;
pub mod signing;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub mod ratelimit;

#[cfg(feature = "client")]
pub use client::{
    CallStats, ClientConfig, CloudStackClient, Credentials, Listing, RetryPolicy, VmListQuery,
    VmListing,
};
pub use diagnostics::{read_arping, read_ping, DiagnosticsKind, ProbeReading};
pub use error::{CloudStackError, ErrorDetail};
pub use parse::{AsyncJobState, ItemFailure, ListPage, Reply};
#[cfg(feature = "client")]
pub use ratelimit::{RateLimit, TokenBucket};
