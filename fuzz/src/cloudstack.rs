//! `crate::cloudstack` of the library: the response parser, the error envelope and the signer.

#[path = "../../src/cloudstack/error.rs"]
pub mod error;
#[path = "../../src/cloudstack/model.rs"]
pub mod model;
#[path = "../../src/cloudstack/parse.rs"]
pub mod parse;
#[path = "../../src/cloudstack/signing.rs"]
pub mod signing;

pub use error::{CloudStackError, ErrorDetail};
pub use parse::{ItemFailure, ListPage, Reply};
