//! The CloudStack side: wire model, request signing, response parsing, the HTTP client.

pub mod model;
pub mod signing;
