//! Errors of the Kubernetes side, typed: a 403 (RBAC), a 404 (the object is gone), a 409 (a
//! conflict), a timeout and an unreachable API server call for different reactions and are
//! counted apart in metrics (`error` label). Messages name objects, never Secret content.

use std::time::Duration;

use thiserror::Error;

/// What went wrong talking to a Kubernetes API server (the management cluster's, or a
/// workload cluster's for the NodeNotLinked lookup).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum KubeError {
    /// 401/403: the shim's RBAC (or token) does not allow it.
    #[error("{what}: forbidden ({code}): {message}")]
    Forbidden {
        what: String,
        code: u16,
        message: String,
    },
    /// 404: the object does not exist (any more).
    #[error("{what} does not exist")]
    NotFound { what: String },
    /// 409: someone else changed or holds it.
    #[error("{what}: conflict: {message}")]
    Conflict { what: String, message: String },
    /// 400/422: the server rejected what was sent.
    #[error("{what}: rejected ({code}): {message}")]
    Invalid {
        what: String,
        code: u16,
        message: String,
    },
    /// 429 or 5xx: the server is there but cannot serve it now.
    #[error("{what}: server unavailable ({code}): {message}")]
    Unavailable {
        what: String,
        code: u16,
        message: String,
    },
    /// No answer within the call's own timeout.
    #[error("{what}: no answer within {}s", .after.as_secs_f64())]
    Timeout { what: String, after: Duration },
    /// Connection, TLS or decoding trouble: no HTTP answer to judge.
    #[error("{what}: {message}")]
    Transport { what: String, message: String },
    /// The object or its configuration is unusable (a Secret without the key, a bad kubeconfig).
    #[error("{what}: {message}")]
    Unusable { what: String, message: String },
    /// The shim refused to use it (e.g. a kubeconfig that would run a command): an operator
    /// must fix the object.
    #[error("{what}: refused: {message}")]
    Refused { what: String, message: String },
    /// The leader Lease could not be confirmed before a write: the write was not sent.
    #[error("{what}: not written: {message}")]
    NotLeader { what: String, message: String },
}

impl KubeError {
    /// Classifies a kube-rs error of the call described by `what` (e.g. "Machine ns/name").
    pub fn from_kube(what: impl Into<String>, e: &kube::Error) -> Self {
        let what = what.into();
        match e {
            kube::Error::Api(s) => {
                let message = s.message.clone();
                match s.code {
                    401 | 403 => Self::Forbidden {
                        what,
                        code: s.code,
                        message,
                    },
                    404 => Self::NotFound { what },
                    409 => Self::Conflict { what, message },
                    400 | 422 => Self::Invalid {
                        what,
                        code: s.code,
                        message,
                    },
                    code => Self::Unavailable {
                        what,
                        code,
                        message,
                    },
                }
            }
            other => Self::Transport {
                what,
                message: other.to_string(),
            },
        }
    }

    /// The `error` label of metrics: a closed set.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Forbidden { .. } => "forbidden",
            Self::NotFound { .. } => "not_found",
            Self::Conflict { .. } => "conflict",
            Self::Invalid { .. } => "invalid",
            Self::Unavailable { .. } => "unavailable",
            Self::Timeout { .. } => "timeout",
            Self::Transport { .. } => "transport",
            Self::Unusable { .. } => "unusable",
            Self::Refused { .. } => "refused",
            Self::NotLeader { .. } => "not_leader",
        }
    }
}

/// Runs `call` with its own timeout; a late answer is a [`KubeError::Timeout`].
pub async fn within<T>(
    after: Duration,
    what: impl Into<String>,
    call: impl std::future::Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(after, call).await {
        Ok(result) => result,
        Err(_) => Err(KubeError::Timeout {
            what: what.into(),
            after,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("m{code}"), "Reason").with_code(code),
        ))
    }

    #[test]
    fn status_codes_map_to_distinct_labels() {
        let labels: Vec<&str> = [403, 401, 404, 409, 422, 400, 429, 500, 503]
            .into_iter()
            .map(|c| KubeError::from_kube("Machine a/b", &api(c)).label())
            .collect();
        assert_eq!(
            labels,
            [
                "forbidden",
                "forbidden",
                "not_found",
                "conflict",
                "invalid",
                "invalid",
                "unavailable",
                "unavailable",
                "unavailable"
            ]
        );
        let e = KubeError::from_kube("Machine a/b", &api(409));
        assert_eq!(e.to_string(), "Machine a/b: conflict: m409");
    }

    #[tokio::test]
    async fn a_call_past_its_timeout_is_a_timeout() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), KubeError>(())
        };
        let e = within(Duration::from_millis(20), "Machine a/b", slow)
            .await
            .unwrap_err();
        assert_eq!(e.label(), "timeout");
        assert!(e.to_string().contains("no answer within 0.02s"), "{e}");
    }
}
