//! Reading what CloudStack answered the probe: a finished job's output as the router's tool
//! printed it (`cloudstack::diagnostics`), an API error (a refused key turns the probe off),
//! and which endpoint a probe key belongs to.

use crate::cloudstack::client::DiagnosticsKind;
use crate::cloudstack::diagnostics::{read_arping, read_ping, ProbeReading};
use crate::cloudstack::error::CloudStackError;
use crate::cloudstack::model::DiagnosticsOutput;
use crate::verdict::probe::{ProbeAnswer, ProbeNic};

/// Outcome of one finished (or failed) job.
pub(super) enum JobEnd {
    Answer(ProbeAnswer),
    /// arping could not run (its setup error): ask with ping instead.
    TryPing(String),
    Refused(String),
}

/// A finished job's output, read as the tool printed it.
pub(super) fn read_job_output(
    kind: DiagnosticsKind,
    router: &str,
    nic: &ProbeNic,
    value: &serde_json::Value,
) -> JobEnd {
    let out: DiagnosticsOutput = match serde_json::from_value(value.clone()) {
        Ok(o) => o,
        Err(e) => {
            return JobEnd::Answer(ProbeAnswer::NoEvidence(format!(
                "the {} job's result is not a diagnostics answer: {e}",
                kind.as_str()
            )))
        }
    };
    let reading = match kind {
        DiagnosticsKind::Arping => read_arping(&out, nic.mac.as_deref()),
        DiagnosticsKind::Ping => read_ping(&out),
    };
    match (kind, reading) {
        (_, ProbeReading::Reply { .. }) => JobEnd::Answer(ProbeAnswer::Reply),
        (_, ProbeReading::NoReply) => JobEnd::Answer(ProbeAnswer::NoReply),
        (_, ProbeReading::ReplyFromOtherMac { mac }) => {
            JobEnd::Answer(ProbeAnswer::NoEvidence(format!(
                "{} was answered by MAC {mac}, not the NIC's (a duplicate address or proxy ARP)",
                nic.address
            )))
        }
        (DiagnosticsKind::Arping, ProbeReading::NoEvidence(why)) => {
            JobEnd::TryPing(format!("arping on router {}: {why}", router))
        }
        (DiagnosticsKind::Ping, ProbeReading::NoEvidence(why)) => JobEnd::Answer(
            ProbeAnswer::NoEvidence(format!("ping on router {}: {why}", router)),
        ),
    }
}

/// An API error: a refused key stops the probe; anything else is no evidence.
pub(super) fn error_end(e: &CloudStackError, doing: &str) -> JobEnd {
    if e.is_refused_by_role() {
        JobEnd::Refused(format!("{doing}: {}", e.stable_summary()))
    } else {
        JobEnd::Answer(ProbeAnswer::NoEvidence(format!(
            "{doing}: {}",
            e.stable_summary()
        )))
    }
}

/// Two API URLs name the same endpoint: scheme, host, port and path, case-insensitive host,
/// trailing slash ignored.
pub fn same_endpoint(a: &str, b: &str) -> bool {
    fn norm(u: &str) -> Option<String> {
        let url = url::Url::parse(u.trim()).ok()?;
        Some(format!(
            "{}://{}:{}{}",
            url.scheme(),
            url.host_str()?.to_ascii_lowercase(),
            url.port_or_known_default()?,
            url.path().trim_end_matches('/')
        ))
    }
    matches!((norm(a), norm(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_match_by_scheme_host_port_and_path() {
        assert!(same_endpoint(
            "https://CS.example:443/client/api",
            "https://cs.example/client/api/"
        ));
        assert!(!same_endpoint(
            "https://cs.example/client/api",
            "http://cs.example/client/api"
        ));
        assert!(!same_endpoint(
            "https://a/client/api",
            "https://b/client/api"
        ));
        assert!(!same_endpoint("not a url", "not a url"));
    }
}
