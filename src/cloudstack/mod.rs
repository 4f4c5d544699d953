//! The CloudStack side: wire model, request signing, response parsing, the HTTP client.

pub mod client;
pub mod error;
pub mod model;
pub mod parse;
pub mod ratelimit;
pub mod signing;

pub use client::{
    CallStats, ClientConfig, CloudStackClient, Credentials, Listing, RetryPolicy, VmListQuery,
    VmListing,
};
pub use error::{CloudStackError, ErrorDetail};
pub use parse::{ItemFailure, ListPage, Reply};
pub use ratelimit::{RateLimit, TokenBucket};
