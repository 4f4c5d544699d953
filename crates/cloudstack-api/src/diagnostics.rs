//! The opt-in guest probe's pure half: which tool `runDiagnostics` runs on the virtual router,
//! which extra options CloudStack lets through, what the tool's output says about the guest,
//! and whether an error means the key's role may not call the API (docs/guest-probe.md).
//!
//! The readings never say "dead": a silent guest is [`ProbeReading::NoReply`] only on the one
//! answer that can mean nothing else, everything unclear is [`ProbeReading::NoEvidence`].

use std::fmt;

use serde_json::Value;

use crate::error::{sanitize_text, CloudStackError, MAX_SNIPPET_CHARS};
use crate::model::DiagnosticsOutput;

/// The tools the probe runs. CloudStack knows `ping`, `ping6`, `traceroute`, `traceroute6` and
/// `arping` (`api/.../diagnostics/DiagnosticsType.java@400e1ee7`), but the router's script
/// produces output only for `ping`, `traceroute` and `arping` (`diagnostics.py@1c70d424`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiagnosticsKind {
    /// iputils `arping`: answered below IP, so the guest's firewall cannot hide the reply.
    Arping,
    /// GNU inetutils `ping`: a second opinion; the guest's firewall may drop ICMP.
    Ping,
}

impl DiagnosticsKind {
    /// The `type` parameter of `runDiagnostics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Arping => "arping",
            Self::Ping => "ping",
        }
    }
}

impl fmt::Display for DiagnosticsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether CloudStack accepts `params` as extra options: it must match `^[\w\-\s.]+$` with
/// Java's ASCII classes — letters, digits, `_`, `-`, whitespace and `.` — or the job fails
/// with "Optional parameters contain unwanted characters" (`DiagnosticsServiceImpl.java@b9e01c15`,
/// `hasValidChars`). An empty string is accepted: the server then appends nothing.
pub fn params_allowed(params: &str) -> bool {
    params.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '_' | '-' | '.' | ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'
            )
    })
}

/// What one probe's output says about the guest's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProbeReading {
    /// Something at the address answered: the guest's kernel (its MAC, when arping printed
    /// one and it matched or nothing was expected).
    Reply { mac: Option<String> },
    /// arping asked and nobody answered (exit 1 with `Received 0 response(s)`). One such
    /// reading is not a verdict: count it only over several probes spaced apart.
    NoReply,
    /// An ARP reply came, but from another MAC than the NIC's: a duplicate address or proxy
    /// ARP, not evidence that the guest is up.
    ReplyFromOtherMac { mac: String },
    /// The output cannot be read as either; the reason is short and safe to show.
    NoEvidence(String),
}

impl ProbeReading {
    pub fn is_reply(&self) -> bool {
        matches!(self, Self::Reply { .. })
    }
}

/// The job result of `runDiagnostics` (the value [`crate::parse::single_result`] found) as
/// [`DiagnosticsOutput`].
pub fn diagnostics_output(result: &Value) -> Result<DiagnosticsOutput, CloudStackError> {
    if !result.is_object() {
        return Err(CloudStackError::malformed(
            "runDiagnostics: the job result is not an object with stdout, stderr and exitcode",
        ));
    }
    serde_json::from_value(result.clone()).map_err(|e| {
        CloudStackError::malformed(format!(
            "runDiagnostics: the job result does not read ({e})"
        ))
    })
}

/// Reads iputils arping's output (`arping.c@9900265d`, docs/guest-probe.md §3): exit 0 with
/// `Received N response(s)`, N ≥ 1, is a reply; exit 1 with `Received 0 response(s)` is no
/// reply; exit 2 (socket, device, usage — e.g. "Suitable device could not be determined")
/// and anything else is no evidence. With `expected_mac`, a reply only from other MACs is
/// [`ProbeReading::ReplyFromOtherMac`]; arping prints MACs in upper case, CloudStack in lower,
/// so they are compared as numbers.
pub fn read_arping(out: &DiagnosticsOutput, expected_mac: Option<&str>) -> ProbeReading {
    let code = match exit_code(out) {
        Ok(c) => c,
        Err(why) => return ProbeReading::NoEvidence(format!("arping: {why}")),
    };
    let stdout = tool_text(&out.stdout);
    let received = last_number_between(&stdout, "Received ", " response");
    match (code, received) {
        (0, Some(n)) if n >= 1 => {
            let macs = reply_macs(&stdout);
            let expected = expected_mac.and_then(parse_mac);
            match expected {
                Some(want) => {
                    if let Some((shown, _)) = macs.iter().find(|(_, m)| *m == want) {
                        ProbeReading::Reply {
                            mac: Some(shown.clone()),
                        }
                    } else if let Some((shown, _)) = macs.first() {
                        ProbeReading::ReplyFromOtherMac { mac: shown.clone() }
                    } else {
                        // The count says someone answered, the reply line did not parse.
                        ProbeReading::Reply { mac: None }
                    }
                }
                None => ProbeReading::Reply {
                    mac: macs.first().map(|(shown, _)| shown.clone()),
                },
            }
        }
        (0, _) => ProbeReading::NoEvidence(
            "arping exited 0 without a `Received N response(s)` count of 1 or more".to_string(),
        ),
        (1, Some(0)) => ProbeReading::NoReply,
        (1, _) => ProbeReading::NoEvidence(with_stderr(
            "arping exited 1 without `Received 0 response(s)`",
            out,
        )),
        (2, _) => ProbeReading::NoEvidence(with_stderr("arping could not probe (exit 2)", out)),
        (c, _) => ProbeReading::NoEvidence(with_stderr(&format!("arping exited {c}"), out)),
    }
}

/// Reads GNU inetutils ping's output (`ping/ping_echo.c@4f42626b`, docs/guest-probe.md §3):
/// exit 0 with `M packets received`, M ≥ 1, is a reply. Exit 1 is no evidence: inetutils
/// exits 1 both when no reply came and on errors such as "unknown host".
pub fn read_ping(out: &DiagnosticsOutput) -> ProbeReading {
    let code = match exit_code(out) {
        Ok(c) => c,
        Err(why) => return ProbeReading::NoEvidence(format!("ping: {why}")),
    };
    let stdout = tool_text(&out.stdout);
    // inetutils: `4 packets transmitted, 4 packets received, 0% packet loss`; iputils (not on
    // the template, accepted anyway): `4 packets transmitted, 4 received, …`.
    let received = last_number_before(&stdout, " packets received")
        .or_else(|| last_number_before(&stdout, " received,"));
    match (code, received) {
        (0, Some(m)) if m >= 1 => ProbeReading::Reply { mac: None },
        (0, _) => ProbeReading::NoEvidence(
            "ping exited 0 without a `packets received` count of 1 or more".to_string(),
        ),
        (1, _) => ProbeReading::NoEvidence(with_stderr(
            "ping exited 1, which GNU ping uses both for no reply and for errors",
            out,
        )),
        (c, _) => ProbeReading::NoEvidence(with_stderr(&format!("ping exited {c}"), out)),
    }
}

/// The exit code, read first: it decides which patterns count.
fn exit_code(out: &DiagnosticsOutput) -> Result<i64, String> {
    let t = tool_text(&out.exitcode);
    let t = t.trim();
    if t.is_empty() {
        return Err("no exit code in the answer".to_string());
    }
    t.parse::<i64>()
        .ok()
        .or_else(|| {
            t.parse::<f64>()
                .ok()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e9)
                .map(|f| f as i64)
        })
        .ok_or_else(|| {
            format!(
                "the exit code {:?} is not a number",
                sanitize_text(t, MAX_SNIPPET_CHARS)
            )
        })
}

/// `why` with a short, sanitized excerpt of the tool's stderr (stdout when stderr is empty:
/// `diagnostics.py` puts "Check your command type" there when the tool cannot start).
fn with_stderr(why: &str, out: &DiagnosticsOutput) -> String {
    let err = tool_text(&out.stderr);
    let text = if err.trim().is_empty() {
        tool_text(&out.stdout)
    } else {
        err
    };
    let text = sanitize_text(&text, MAX_SNIPPET_CHARS);
    if text.is_empty() {
        why.to_string()
    } else {
        format!("{why}: {text}")
    }
}

/// The tool's text: `diagnostics.py` formats Python 3 bytes with `%s` without decoding, so
/// the field may read `b'ARPING …\nSent 1 probes…'` with `\n` as two characters
/// (docs/guest-probe.md §3, derived from `diagnostics.py@1c70d424`). Such a literal is
/// decoded; any other text is taken as it is.
pub fn tool_text(field: &str) -> String {
    decode_bytes_literal(field).unwrap_or_else(|| field.to_string())
}

/// Decodes a Python bytes repr (`b'…'` or `b"…"`): `\\`, `\'`, `\"`, `\n`, `\r`, `\t` and
/// `\xhh`; an unknown escape is kept as written. `None` when `s` is not such a literal.
fn decode_bytes_literal(s: &str) -> Option<String> {
    let s = s.trim();
    let body = s
        .strip_prefix("b'")
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| s.strip_prefix("b\"").and_then(|r| r.strip_suffix('"')))?;
    let mut out: Vec<u8> = Vec::with_capacity(body.len());
    let mut chars = body.chars();
    let mut buf = [0u8; 4];
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('n') => out.push(b'\n'),
            Some('r') => out.push(b'\r'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some('\'') => out.push(b'\''),
            Some('"') => out.push(b'"'),
            Some('x') => {
                let hex: String = chars.clone().take(2).collect();
                match u8::from_str_radix(&hex, 16) {
                    Ok(b) if hex.len() == 2 && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
                        out.push(b);
                        chars.nth(1);
                    }
                    _ => out.extend_from_slice(b"\\x"),
                }
            }
            Some(other) => {
                out.push(b'\\');
                out.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
            }
            None => out.push(b'\\'),
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The number in the last `<before><digits><after>` of `text`.
fn last_number_between(text: &str, before: &str, after: &str) -> Option<u64> {
    text.rmatch_indices(before).find_map(|(i, _)| {
        let rest = &text[i + before.len()..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || !rest[digits..].starts_with(after) {
            return None;
        }
        rest[..digits].parse().ok()
    })
}

/// The number that ends right before the last `<after>` of `text`.
fn last_number_before(text: &str, after: &str) -> Option<u64> {
    text.rmatch_indices(after).find_map(|(i, _)| {
        let head = &text[..i];
        let start = head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let digits = &head[start..];
        if digits.is_empty() {
            return None;
        }
        digits.parse().ok()
    })
}

/// MACs of `Unicast reply from <ip> [<MAC>]` (and `Broadcast reply from`), as printed and as
/// bytes, first occurrence of each.
fn reply_macs(text: &str) -> Vec<(String, [u8; 6])> {
    let mut out: Vec<(String, [u8; 6])> = Vec::new();
    for (i, _) in text.match_indices("reply from ") {
        let rest = &text[i..];
        let line_end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        let line = &rest[..line_end];
        let Some(open) = line.find('[') else { continue };
        let Some(len) = line[open + 1..].find(']') else {
            continue;
        };
        let shown = &line[open + 1..open + 1 + len];
        if let Some(mac) = parse_mac(shown) {
            if !out.iter().any(|(_, m)| *m == mac) {
                out.push((shown.to_string(), mac));
            }
        }
    }
    out
}

/// `02:00:4C:1b:0:5` (or with `-`) as bytes; `None` for anything else.
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split([':', '-']);
    for byte in &mut mac {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 2 || !p.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        *byte = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Phrases of CloudStack's `DynamicRoleBasedAPIAccessChecker` (`DRB@5e8d8028`,
/// docs/guest-probe.md §5): a role rule denies the API, or no rule allows it and its
/// annotation does not list the role's type.
const ROLE_REFUSALS: [&str; 2] = [
    "is denied for the account's role",
    "does not exist or is not available for this account",
];

impl CloudStackError {
    /// The key's role may not call the API: an answer of CloudStack's role checker (a rule
    /// denies it, or it is not available to the role, docs/guest-probe.md §5), or anything
    /// [`CloudStackError::is_command_unavailable`] recognises (432, a 401 for an unknown
    /// command, [`CloudStackError::Unsupported`]). Not worth retrying in a loop: report it
    /// once and give the probe up until the role changes.
    pub fn is_refused_by_role(&self) -> bool {
        if self.is_command_unavailable() {
            return true;
        }
        self.detail()
            .and_then(|d| d.errortext.as_deref())
            .is_some_and(|t| {
                let t = t.to_ascii_lowercase();
                ROLE_REFUSALS.iter().any(|p| t.contains(p))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse_async_job, single_result, AsyncJobState, Reply};

    fn out(stdout: &str, stderr: &str, exitcode: &str) -> DiagnosticsOutput {
        DiagnosticsOutput {
            stdout: stdout.into(),
            stderr: stderr.into(),
            exitcode: exitcode.into(),
        }
    }

    // iputils arping as `diagnostics.py` passes it on: a Python 3 bytes literal, newlines as
    // the two characters `\n` (raw strings keep them so).
    const ARPING_REPLY: &str = r"b'ARPING 10.1.1.5 from 10.1.1.2 eth2\nUnicast reply from 10.1.1.5 [02:00:4C:1B:00:05]  0.712ms\nSent 1 probes (1 broadcast(s))\nReceived 1 response(s)'";
    const ARPING_SILENT: &str = r"b'ARPING 10.1.1.9 from 10.1.1.2 eth2\nSent 3 probes (3 broadcast(s))\nReceived 0 response(s)'";
    const NIC_MAC: &str = "02:00:4c:1b:00:05";

    #[test]
    fn an_arping_reply_from_the_nics_mac_is_a_reply() {
        let r = read_arping(&out(ARPING_REPLY, "b''", "0"), Some(NIC_MAC));
        assert_eq!(
            r,
            ProbeReading::Reply {
                mac: Some("02:00:4C:1B:00:05".into())
            }
        );
        assert!(r.is_reply());
        // plain text too, and without an expected MAC
        let plain = tool_text(ARPING_REPLY);
        assert!(plain.contains("\nReceived 1 response(s)"), "{plain}");
        assert_eq!(
            read_arping(&out(&plain, "", "0"), None),
            ProbeReading::Reply {
                mac: Some("02:00:4C:1B:00:05".into())
            }
        );
        // an expected MAC that is not one reads as none expected
        assert!(read_arping(&out(ARPING_REPLY, "", "0"), Some("n/a")).is_reply());
    }

    #[test]
    fn an_arping_reply_from_another_mac_is_not_the_guest() {
        let r = read_arping(&out(ARPING_REPLY, "", "0"), Some("02:00:4c:1b:00:06"));
        assert_eq!(
            r,
            ProbeReading::ReplyFromOtherMac {
                mac: "02:00:4C:1B:00:05".into()
            }
        );
        // two answers, the NIC's among them: the guest answered
        let two = r"b'ARPING 10.1.1.5 from 10.1.1.2 eth2\nUnicast reply from 10.1.1.5 [0E:00:00:00:00:01]  0.5ms\nUnicast reply from 10.1.1.5 [02:00:4C:1B:00:05]  0.7ms\nSent 2 probes (1 broadcast(s))\nReceived 2 response(s)'";
        assert!(read_arping(&out(two, "", "0"), Some(NIC_MAC)).is_reply());
        // the count says yes but no reply line parses: a reply, MAC unknown
        let bare = r"b'Sent 1 probes (1 broadcast(s))\nReceived 1 response(s)'";
        assert_eq!(
            read_arping(&out(bare, "", "0"), Some(NIC_MAC)),
            ProbeReading::Reply { mac: None }
        );
    }

    #[test]
    fn only_exit_1_with_zero_responses_is_no_reply() {
        assert_eq!(
            read_arping(&out(ARPING_SILENT, "b''", "1"), Some(NIC_MAC)),
            ProbeReading::NoReply
        );
        assert_eq!(
            read_arping(&out(&tool_text(ARPING_SILENT), "", " 1 "), None),
            ProbeReading::NoReply
        );
        // the script could not start the tool
        let r = read_arping(
            &out(
                "Check your command type",
                "Exception occurred: [Errno 2] No such file or directory: 'arping'",
                "1",
            ),
            None,
        );
        assert!(
            matches!(&r, ProbeReading::NoEvidence(why) if why.contains("No such file")),
            "{r:?}"
        );
        // zero responses with exit 0, or responses with exit 1: not what arping does
        assert!(matches!(
            read_arping(&out(ARPING_SILENT, "", "0"), None),
            ProbeReading::NoEvidence(_)
        ));
        assert!(matches!(
            read_arping(&out(ARPING_REPLY, "", "1"), None),
            ProbeReading::NoEvidence(_)
        ));
    }

    #[test]
    fn arping_setup_errors_and_garbage_are_no_evidence() {
        let r = read_arping(
            &out(
                "b''",
                "b'arping: Suitable device could not be determined. Please, use option -I.\\nUsage: arping ...'",
                "2",
            ),
            Some(NIC_MAC),
        );
        match &r {
            ProbeReading::NoEvidence(why) => {
                assert!(why.contains("exit 2"), "{why}");
                assert!(why.contains("use option -I"), "{why}");
                assert!(!why.contains('\n') && why.chars().count() < 200, "{why}");
            }
            other => panic!("{other:?}"),
        }
        for (o, says) in [
            (out(ARPING_REPLY, "", ""), "no exit code"),
            (out(ARPING_REPLY, "", "zero"), "not a number"),
            (out(ARPING_REPLY, "", "137"), "exited 137"),
            (out("<html>502</html>", "", "0"), "without a `Received"),
            (
                out("Received lots response(s)", "", "0"),
                "without a `Received",
            ),
            (out("", "", "-1"), "exited -1"),
        ] {
            match read_arping(&o, Some(NIC_MAC)) {
                ProbeReading::NoEvidence(why) => assert!(why.contains(says), "{o:?}: {why}"),
                other => panic!("{o:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn ping_replies_count_only_with_exit_0() {
        let reply = r"b'PING 10.1.1.5 (10.1.1.5): 56 data bytes\n64 bytes from 10.1.1.5: icmp_seq=0 ttl=64 time=0.402 ms\n--- 10.1.1.5 ping statistics ---\n4 packets transmitted, 4 packets received, 0% packet loss\nround-trip min/avg/max/stddev = 0.3/0.4/0.5/0.1 ms'";
        assert_eq!(
            read_ping(&out(reply, "b''", "0")),
            ProbeReading::Reply { mac: None }
        );
        assert_eq!(
            read_ping(&out(&tool_text(reply), "", "0")),
            ProbeReading::Reply { mac: None }
        );
        let silent = r"b'PING 10.1.1.9 (10.1.1.9): 56 data bytes\n--- 10.1.1.9 ping statistics ---\n4 packets transmitted, 0 packets received, 100% packet loss'";
        match read_ping(&out(silent, "b''", "1")) {
            ProbeReading::NoEvidence(why) => assert!(why.contains("both"), "{why}"),
            other => panic!("{other:?}"),
        }
        let unknown = read_ping(&out("b''", "b'ping: unknown host'", "1"));
        assert!(
            matches!(&unknown, ProbeReading::NoEvidence(why) if why.contains("unknown host")),
            "{unknown:?}"
        );
        for o in [
            out(silent, "", "0"),
            out("b'garbage'", "", "0"),
            out(reply, "", "2"),
            out(reply, "", ""),
        ] {
            assert!(
                matches!(read_ping(&o), ProbeReading::NoEvidence(_)),
                "{o:?}"
            );
        }
        // iputils' summary (not on the template) reads the same
        assert!(read_ping(&out(
            "3 packets transmitted, 1 received, 66% packet loss",
            "",
            "0"
        ))
        .is_reply());
    }

    #[test]
    fn bytes_literals_decode_and_other_text_stays() {
        assert_eq!(tool_text(r"b'a\nb\tc\\d\'e'"), "a\nb\tc\\d'e");
        assert_eq!(tool_text(r#"b"it's""#), "it's");
        assert_eq!(tool_text(r"b'caf\xc3\xa9 \x4'"), "café \\x4");
        assert_eq!(tool_text(r"b'\q\x+f'"), "\\q\\x+f");
        assert_eq!(tool_text("b''"), "");
        assert_eq!(tool_text("  b'x'  "), "x");
        assert_eq!(tool_text("plain\\n text"), "plain\\n text");
        assert_eq!(tool_text("b'unterminated"), "b'unterminated");
        assert_eq!(tool_text(r"b'\'"), "\\");
        for odd in ["b'", "b\"", "b'\\x'", "b'\\xé'", "b'é\\'", "\u{0}"] {
            let _ = tool_text(odd);
        }
    }

    #[test]
    fn macs_are_compared_as_bytes() {
        assert_eq!(
            parse_mac("02:00:4C:1B:00:05"),
            parse_mac("02-00-4c-1b-00-05")
        );
        assert_eq!(parse_mac("2:0:4c:1b:0:5"), parse_mac(NIC_MAC));
        for bad in [
            "",
            "02:00:4c:1b:00",
            "02:00:4c:1b:00:05:06",
            "02:00:4c:1b:00:zz",
            "+2:0:0:0:0:0",
            "002:0:0:0:0:0",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn params_follow_the_servers_character_class() {
        for ok in ["-c 3 -f", "-c 3 -f -I eth2", "-w 5", "", "\t-c\n3", "a_b.c"] {
            assert!(params_allowed(ok), "{ok:?}");
        }
        for bad in [
            "-c 3;", "$(x)", "`x`", "a|b", "a&b", "a/b", "é", "-c=3", "\u{a0}",
        ] {
            assert!(!params_allowed(bad), "{bad:?}");
        }
        assert_eq!(DiagnosticsKind::Arping.as_str(), "arping");
        assert_eq!(DiagnosticsKind::Ping.to_string(), "ping");
    }

    #[test]
    fn a_job_result_reads_as_diagnostics_output() {
        let body = serde_json::json!({"queryasyncjobresultresponse": {"jobstatus": 1,
            "jobresult": {"diagnostics": {"stdout": ARPING_SILENT, "stderr": "b''", "exitcode": "1"}}}})
        .to_string();
        let AsyncJobState::Succeeded(v) = parse_async_job(Reply::json(body.as_bytes())).unwrap()
        else {
            panic!("not a success")
        };
        let o = diagnostics_output(&v).unwrap();
        assert_eq!(read_arping(&o, Some(NIC_MAC)), ProbeReading::NoReply);
        let list = serde_json::json!({"count": 1, "diagnostics": [{"exitcode": 0}]});
        let o = diagnostics_output(single_result(&list).unwrap()).unwrap();
        assert_eq!(o.exitcode, "0");
        for bad in [
            serde_json::json!("x"),
            serde_json::json!([1]),
            serde_json::json!(null),
        ] {
            assert_eq!(diagnostics_output(&bad).unwrap_err().kind(), "malformed");
        }
    }

    #[test]
    fn role_refusals_are_recognised() {
        let refused = [
            CloudStackError::from_code(
                401,
                None,
                Some("The API runDiagnostics is denied for the account's role."),
                false,
            ),
            CloudStackError::from_code(
                401,
                Some(9999),
                Some("The API runDiagnostics does not exist or is not available for this account."),
                false,
            ),
            CloudStackError::from_code(
                530,
                None,
                Some("The API listRouters is denied for the account's role."),
                false,
            ),
            CloudStackError::from_code(
                432,
                Some(9999),
                Some("The given command does not exist or it is not available for user"),
                false,
            ),
            CloudStackError::from_code(401, None, None, true),
            CloudStackError::Unsupported {
                command: "runDiagnostics".into(),
                detail: Default::default(),
            },
        ];
        for e in &refused {
            assert!(e.is_refused_by_role(), "{e:?}");
            assert!(!e.is_retryable() || e.kind() == "server_error", "{e:?}");
        }
        let not = [
            CloudStackError::from_code(
                401,
                None,
                Some("unable to verify user credentials and/or request signature"),
                false,
            ),
            CloudStackError::from_code(
                530,
                None,
                Some("Unable to find host for virtual machine instance: r-7-VM"),
                false,
            ),
            CloudStackError::from_code(
                431,
                None,
                Some("Invalid parameter targetid value=0d1e6f3a due to incorrect long value format, or entity does not exist"),
                false,
            ),
            CloudStackError::Malformed {
                detail: "is denied for the account's role".into(),
            },
            CloudStackError::Timeout {
                after: std::time::Duration::from_secs(1),
            },
        ];
        for e in &not {
            assert!(!e.is_refused_by_role(), "{e:?}");
        }
    }
}
