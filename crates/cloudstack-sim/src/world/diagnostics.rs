//! `runDiagnostics` on a virtual router: the checks of `DiagnosticsServiceImpl` (in its
//! order), the per-router queue, the tools `diagnostics.py` runs on the router (iputils
//! `arping`, GNU inetutils `ping`, `traceroute`) and what they print, as the job's result.
//! Facts and citations: docs/guest-probe.md §1–§3 (`DSI` = `DiagnosticsServiceImpl.java@b9e01c15`,
//! `DPY` = `diagnostics.py@1c70d424`, `arping.c@9900265d`, inetutils `ping_echo.c@4f42626b`).
//!
//! The guest is judged when the job is submitted (a probe queued behind another one on the
//! same router reports what the guest was at submission); the job stays pending until the
//! tool would have ended, in simulated time.

use std::net::Ipv4Addr;

use crate::catalog::{JobCommand, JobStatus};
use crate::traffic::{mix, Profile};

use super::{Fault, Ms, RouterState, Vm, VmState, World};

/// `DiagnosticsType` (`api/.../diagnostics/DiagnosticsType.java@400e1ee7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagType {
    Ping,
    Ping6,
    Traceroute,
    Traceroute6,
    Arping,
}

impl DiagType {
    pub const ALL: [DiagType; 5] = [
        Self::Ping,
        Self::Ping6,
        Self::Traceroute,
        Self::Traceroute6,
        Self::Arping,
    ];

    /// `DiagnosticsType.getCommand`: case-insensitive (guest-probe.md §1).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ping => "ping",
            Self::Ping6 => "ping6",
            Self::Traceroute => "traceroute",
            Self::Traceroute6 => "traceroute6",
            Self::Arping => "arping",
        }
    }
}

/// What `runDiagnostics` was asked to do; `target` is resolved by the handler.
#[derive(Debug, Clone)]
pub struct DiagRequest {
    pub target: DiagTarget,
    pub kind: String,
    pub ipaddress: String,
    /// `params`, already dropped for callers whose role type is not Admin (RDC: the parameter
    /// is `authorized = {RoleType.Admin}`, guest-probe.md §1).
    pub params: Option<String>,
}

/// The VM `targetid` names (any VM instance resolves in parameter processing).
#[derive(Debug, Clone, Copy)]
pub enum DiagTarget {
    Router(usize),
    /// A user VM: (internal id, index).
    UserVm(u64, usize),
}

/// The three strings of `RunDiagnosticsResponse` (all strings: guest-probe.md §1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagOutput {
    pub stdout: String,
    pub stderr: String,
    pub exitcode: String,
}

/// How a diagnostics job ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiagOutcome {
    Output(DiagOutput),
    /// The job fails: `cserrorcode`, `errortext`.
    Fail(u32, String),
}

/// One diagnostics run (job).
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub router: Option<usize>,
    pub start_ms: Ms,
    pub end_ms: Ms,
    pub outcome: DiagOutcome,
}

/// `cserrorcode`s of the exceptions thrown inside the job (`CSExceptionErrorCode`; that the
/// async job reports them so is **unverified**, guest-probe.md §2 step 6).
const CS_INVALID_PARAMETER: u32 = 4350;
const CS_RUNTIME: u32 = 4250;
const CS_OTHER: u32 = 9999;

/// A failed async job's `errorcode`: the dispatcher reports an exception that is not a
/// `ServerApiException` as INTERNAL_ERROR (530; **unverified**, guest-probe.md §2 step 6).
pub const DIAG_FAIL_CODE: u16 = 530;

/// `DSI.hasValidChars`: `^[\w\-\s.]+$` (Java: `\w` = `[a-zA-Z_0-9]`, `\s` = whitespace).
pub fn params_valid(p: &str) -> bool {
    !p.is_empty()
        && p.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    '_' | '-' | '.' | ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'
                )
        })
}

/// Python 3's `repr()` of a bytes object (DPY formats `communicate()`'s bytes with `%s`
/// without decoding, guest-probe.md §3): `b'…'` with `\n` as two characters.
pub fn py_bytes_repr(b: &[u8]) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    let mut s = String::from("b");
    s.push(quote);
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            c if c as char == quote => {
                s.push('\\');
                s.push(quote);
            }
            0x20..=0x7e => s.push(c as char),
            c => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push(quote);
    s
}

/// What one tool run printed and how long it took.
struct Run {
    stdout: String,
    stderr: String,
    code: i32,
    duration_ms: Ms,
}

impl Run {
    fn usage(tool: &str, what: &str, code: i32) -> Self {
        Run {
            stdout: String::new(),
            stderr: format!("{tool}: {what}\n"),
            code,
            duration_ms: 0,
        }
    }
}

/// The guest that would answer `ip` on the router's link at `t`: its NIC's MAC.
fn answering_mac(w: &World, router: usize, ip: Ipv4Addr, t: Ms) -> Option<String> {
    let network = w.routers[router].network;
    let vm = w.vms.iter().find(|vm| {
        !vm.removed
            && vm
                .nic
                .as_ref()
                .is_some_and(|n| n.network == network && n.ip == Some(ip))
    })?;
    guest_answers(w, vm, t).then(|| vm.nic.as_ref().map(|n| n.mac.to_uppercase()))?
}

/// Whether the guest's kernel answers ARP (and ICMP echo) on its NIC at `t`: the VM runs (or
/// migrates, the guest running on), its NIC link is up (no nic-down or detach-nic fault,
/// no traffic profile that says the NIC is down) and its kernel has configured the address:
/// the boot's DHCP exchange is over (the first sub-phase of the `boot` profile,
/// `traffic/mod.rs`). Services (`services-fail`), kubeadm (`waiting`, `slow-boot`) do not
/// matter: ARP is answered by the kernel. `no-address` hides the address from the API only.
pub fn guest_answers(w: &World, vm: &Vm, t: Ms) -> bool {
    let Some(rs) = vm.running_since else {
        return false;
    };
    let link_down = matches!(
        vm.profile_at(t),
        Some(Profile::NicDown | Profile::OneNicDown | Profile::Silent)
    );
    matches!(vm.state, VmState::Running | VmState::Migrating)
        && !vm.has(Fault::NicDown)
        && !vm.has(Fault::DetachNic)
        && !link_down
        && t >= rs + w.ctx().timing.dhcp_ms()
}

/// A reply's round-trip time in ms (deterministic, 0.2–0.9 ms on the same L2).
fn rtt_ms(seed: u64, k: u64) -> f64 {
    0.2 + (mix(seed, k) % 700) as f64 / 1000.0
}

/// Options of a command line: `-x`, `-xVALUE` or `-x VALUE` for the options in `with_value`.
/// Returns (options, positional arguments) or the offending option.
#[allow(clippy::type_complexity)]
fn getopt(
    args: &[&str],
    flags: &str,
    with_value: &str,
) -> Result<(Vec<(char, Option<String>)>, Vec<String>), String> {
    let mut opts = Vec::new();
    let mut pos = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        i += 1;
        let Some(rest) = a.strip_prefix('-').filter(|r| !r.is_empty()) else {
            pos.push(a.to_string());
            continue;
        };
        for (at, c) in rest.char_indices() {
            if with_value.contains(c) {
                let inline = &rest[at + c.len_utf8()..];
                let v = if !inline.is_empty() {
                    inline.to_string()
                } else if i < args.len() {
                    i += 1;
                    args[i - 1].to_string()
                } else {
                    return Err(format!("option requires an argument -- '{c}'"));
                };
                opts.push((c, Some(v)));
                break;
            } else if flags.contains(c) {
                opts.push((c, None));
            } else {
                return Err(format!("invalid option -- '{c}'"));
            }
        }
    }
    Ok((opts, pos))
}

/// The last value of option `c` as a number.
fn num(opts: &[(char, Option<String>)], c: char) -> Result<Option<u64>, String> {
    match opts.iter().rev().find(|(o, _)| *o == c) {
        None => Ok(None),
        Some((_, v)) => v
            .as_deref()
            .unwrap_or("")
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("invalid argument: '{}'", v.as_deref().unwrap_or(""))),
    }
}

fn has(opts: &[(char, Option<String>)], c: char) -> bool {
    opts.iter().any(|(o, _)| *o == c)
}

/// iputils `arping` (`arping.c@9900265d`, guest-probe.md §3): requests 1 s apart, `-c`
/// of them; `-f` ends at the first reply; replies make later requests unicast unless `-b`.
/// Exit 0 with ≥ 1 reply, 1 without, 2 on a setup error. It lasts about 1 s per request
/// sent. `-w` is accepted without its deadline semantics (not modelled); options other than
/// `-c -f -b -q -w -I` are refused like unknown ones (**unverified** for `-D -U -A -s`).
fn arping(w: &World, router: usize, args: &[&str], t: Ms) -> Run {
    let (opts, pos) = match getopt(args, "fbq", "cwI") {
        Ok(x) => x,
        Err(e) => return Run::usage("arping", &e, 2),
    };
    let count = match num(&opts, 'c') {
        Ok(c) => c.unwrap_or(u64::MAX).max(1),
        Err(e) => return Run::usage("arping", &e, 2),
    };
    if let Err(e) = num(&opts, 'w') {
        return Run::usage("arping", &e, 2);
    }
    let [target] = pos.as_slice() else {
        return Run::usage(
            "arping",
            "usage: arping [-fqbDUAV] [-c count] [-w timeout] [-I device] [-s source] destination",
            2,
        );
    };
    let Ok(ip) = target.parse::<Ipv4Addr>() else {
        // getaddrinfo fails (the wording is **unverified**).
        return Run::usage("arping", &format!("{target}: Name or service not known"), 2);
    };
    let r = &w.routers[router];
    // The route to a guest of the network goes out of the guest NIC, eth0 (device guessing,
    // guest-probe.md §3); another device is not on the guest's link.
    let dev = opts
        .iter()
        .rev()
        .find(|(o, _)| *o == 'I')
        .and_then(|(_, v)| v.clone())
        .unwrap_or_else(|| "eth0".into());
    let on_link = dev == "eth0";
    let mac = if on_link {
        answering_mac(w, router, ip, t)
    } else {
        None
    };
    // DPY always passes `-c` (4 unless given), so `count` is finite here.
    let count = count.min(3600);
    let (quiet, broadcast_only, first) = (has(&opts, 'q'), has(&opts, 'b'), has(&opts, 'f'));
    let sent = if mac.is_some() && first { 1 } else { count };
    let received = if mac.is_some() { sent } else { 0 };
    let broadcasts = if mac.is_some() && !broadcast_only {
        1
    } else {
        sent
    };
    let mut out = format!("ARPING {ip} from {} {dev}\n", r.guest_ip);
    if let Some(mac) = &mac {
        for k in 0..received {
            out.push_str(&format!(
                "Unicast reply from {ip} [{mac}]  {:.3}ms\n",
                rtt_ms(r.seq ^ u64::from(u32::from(ip)), t as u64 + k)
            ));
        }
    }
    out.push_str(&format!(
        "Sent {sent} probes ({broadcasts} broadcast(s))\nReceived {received} response(s)\n"
    ));
    Run {
        stdout: if quiet { String::new() } else { out },
        stderr: String::new(),
        code: if received > 0 { 0 } else { 1 },
        duration_ms: sent as Ms * 1000,
    }
}

/// GNU inetutils `ping` (`ping/ping_echo.c@4f42626b`, guest-probe.md §3): `-c` echoes 1 s
/// apart; after the last one it waits up to `linger` (`MAXWAIT` = 10 s) for a silent guest.
/// Exit 0 with a reply, 1 without one and 1 on errors such as an unknown host. Options other
/// than `-c -q` are refused with argp's usage status 64 (**unverified**).
fn ping(w: &World, router: usize, args: &[&str], t: Ms) -> Run {
    let (opts, pos) = match getopt(args, "q", "c") {
        Ok(x) => x,
        Err(e) => {
            return Run::usage(
                "ping",
                &format!("{e}\nTry 'ping --help' or 'ping --usage' for more information."),
                64,
            )
        }
    };
    let count = match num(&opts, 'c') {
        Ok(c) => c.unwrap_or(4).clamp(1, 3600),
        Err(e) => return Run::usage("ping", &e, 1),
    };
    let [target] = pos.as_slice() else {
        return Run::usage("ping", "missing host operand", 64);
    };
    let Ok(ip) = target.parse::<Ipv4Addr>() else {
        return Run::usage("ping", "unknown host", 1);
    };
    let r = &w.routers[router];
    let replies = answering_mac(w, router, ip, t).is_some();
    let mut out = format!("PING {ip} ({ip}): 56 data bytes\n");
    let seed = r.seq ^ u64::from(u32::from(ip));
    let times: Vec<f64> = if replies {
        (0..count).map(|k| rtt_ms(seed, t as u64 + k)).collect()
    } else {
        Vec::new()
    };
    if !has(&opts, 'q') {
        for (k, ms) in times.iter().enumerate() {
            out.push_str(&format!(
                "64 bytes from {ip}: icmp_seq={k} ttl=64 time={ms:.3} ms\n"
            ));
        }
    }
    let received = times.len() as u64;
    let loss = (count - received) * 100 / count;
    out.push_str(&format!(
        "--- {ip} ping statistics ---\n{count} packets transmitted, {received} packets received, {loss}% packet loss\n"
    ));
    if received > 0 {
        let min = times.iter().copied().fold(f64::MAX, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        let avg = times.iter().sum::<f64>() / received as f64;
        let var = times.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / received as f64;
        out.push_str(&format!(
            "round-trip min/avg/max/stddev = {min:.3}/{avg:.3}/{max:.3}/{:.3} ms\n",
            var.sqrt()
        ));
    }
    let last_sent = (count as Ms - 1) * 1000;
    Run {
        stdout: out,
        stderr: String::new(),
        code: if received > 0 { 0 } else { 1 },
        duration_ms: if received > 0 {
            last_sent
        } else {
            last_sent + 10_000
        },
    }
}

/// `traceroute` with DPY's `-m 20`. Its output is not in guest-probe.md: modelled on the
/// Linux `traceroute` format (one hop to an on-link guest; `* * *` per hop, about 5 s per
/// 16 probes, for a silent one; exit 0 either way) — **unverified**.
fn traceroute(w: &World, router: usize, args: &[&str], t: Ms) -> Run {
    let (opts, pos) = match getopt(args, "n", "mqw") {
        Ok(x) => x,
        Err(e) => return Run::usage("traceroute", &e, 2),
    };
    let max = match num(&opts, 'm') {
        Ok(m) => m.unwrap_or(30).clamp(1, 255),
        Err(e) => return Run::usage("traceroute", &e, 2),
    };
    let [target] = pos.as_slice() else {
        return Run::usage("traceroute", "Specify \"host\" missing argument.", 2);
    };
    let Ok(ip) = target.parse::<Ipv4Addr>() else {
        return Run::usage(
            "traceroute",
            &format!("{target}: Name or service not known"),
            2,
        );
    };
    let r = &w.routers[router];
    let mut out = format!("traceroute to {ip} ({ip}), {max} hops max, 60 byte packets\n");
    let seed = r.seq ^ u64::from(u32::from(ip));
    let reached = answering_mac(w, router, ip, t).is_some();
    let duration_ms = if reached {
        out.push_str(&format!(
            " 1  {ip} ({ip})  {:.3} ms  {:.3} ms  {:.3} ms\n",
            rtt_ms(seed, 0),
            rtt_ms(seed, 1),
            rtt_ms(seed, 2)
        ));
        1000
    } else {
        for h in 1..=max {
            out.push_str(&format!("{h:>2}  * * *\n"));
        }
        (3 * max as Ms + 15) / 16 * 5000
    };
    Run {
        stdout: out,
        stderr: String::new(),
        code: 0,
        duration_ms,
    }
}

impl World {
    /// Submits `runDiagnostics` by `caller` now; returns the job's index. The checks run in
    /// `DSI.runDiagnosticsCommand`'s order, inside the job: type, system VM, host, `params`.
    pub fn run_diagnostics(&mut self, caller: usize, req: &DiagRequest) -> usize {
        let now = self.now_ms;
        let (router, outcome, start, end) = self.diagnose(req, now);
        let instance = match req.target {
            DiagTarget::Router(r) => self.routers[r].id.clone(),
            DiagTarget::UserVm(_, v) => self.vms[v].id.clone(),
        };
        let status = if end <= now {
            finished(&outcome, now)
        } else {
            JobStatus::Pending
        };
        let job = self.jobs.len();
        self.diagnostics.insert(
            job,
            Diagnostic {
                router,
                start_ms: start,
                end_ms: end,
                outcome,
            },
        );
        self.add_job(
            caller,
            JobCommand::RunDiagnostics { router },
            &instance,
            status,
        )
    }

    /// (router, outcome, start, end) of a diagnostics request submitted at `now`.
    fn diagnose(&mut self, req: &DiagRequest, now: Ms) -> (Option<usize>, DiagOutcome, Ms, Ms) {
        let fail = |cs: u32, text: String| (DiagOutcome::Fail(cs, text), now, now);
        // RDC.getType: IllegalArgumentException.
        let Some(kind) = DiagType::parse(&req.kind) else {
            let (o, s, e) = fail(
                CS_OTHER,
                format!("{} Is not a valid diagnostics command type. ", req.kind),
            );
            return (None, o, s, e);
        };
        // DSI: findByIdTypes(ConsoleProxy, DomainRouter, SecondaryStorageVm), by internal id.
        let r = match req.target {
            DiagTarget::Router(r) => r,
            DiagTarget::UserVm(seq, _) => {
                let (o, s, e) = fail(
                    CS_INVALID_PARAMETER,
                    format!("Unable to find a system vm with id {seq}"),
                );
                return (None, o, s, e);
            }
        };
        let router = &self.routers[r];
        let Some(host) = router.host else {
            let (o, s, e) = fail(
                CS_RUNTIME,
                format!(
                    "Unable to find host for virtual machine instance: {}",
                    router.name
                ),
            );
            return (Some(r), o, s, e);
        };
        // DSI.prepareShellCmd: "<type> <ipaddress>" + params when they pass hasValidChars.
        let params = req.params.as_deref().filter(|p| !p.is_empty());
        if let Some(p) = params {
            if !params_valid(p) {
                let (o, s, e) = fail(
                    CS_OTHER,
                    format!("Optional parameters contain unwanted characters: {p}"),
                );
                return (Some(r), o, s, e);
            }
        }
        // `agentManager.easySend` answers null when the host's agent is not connected.
        if self.hosts[host].status().lost_connection() {
            let (o, s, e) = fail(
                CS_RUNTIME,
                format!(
                    "Failed to execute diagnostics command for system vm: VM instance {{\"instanceName\":\"{}\",\"uuid\":\"{}\"}}, on remote host: {}",
                    router.name, router.id, self.hosts[host].name
                ),
            );
            return (Some(r), o, s, e);
        }
        // The agent's per-router lock: one run at a time.
        let start = router.busy_until.max(now);
        // A router that is still starting has a host but no SSH yet: the run fails
        // (DiagnosticsAnswer, "Command execution failed: <details>"; the details are
        // **unverified**).
        if router.state == RouterState::Starting {
            return (
                Some(r),
                DiagOutcome::Fail(
                    CS_RUNTIME,
                    format!(
                        "Command execution failed: unable to reach {} over SSH on port 3922",
                        router.link_local_ip
                    ),
                ),
                start,
                start,
            );
        }
        let mut line: Vec<&str> = vec![req.ipaddress.as_str()];
        line.extend(
            params
                .map(|p| p.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        // DPY: `-c 4` for ping and arping unless `-c` is among the arguments, `-m 20` for
        // traceroute; other types print nothing.
        let has_c = line.contains(&"-c");
        let run = match kind {
            DiagType::Arping | DiagType::Ping if !has_c => {
                line.extend(["-c", "4"]);
                None
            }
            DiagType::Traceroute => {
                line.extend(["-m", "20"]);
                None
            }
            DiagType::Ping6 | DiagType::Traceroute6 => Some(()),
            _ => None,
        };
        if run.is_some() {
            // No output: DiagnosticsAnswer throws "Command execution failed: " (§2 step 6).
            return (
                Some(r),
                DiagOutcome::Fail(CS_RUNTIME, "Command execution failed: ".into()),
                start,
                start,
            );
        }
        let tool = match kind {
            DiagType::Arping => arping(self, r, &line, now),
            DiagType::Ping => ping(self, r, &line, now),
            _ => traceroute(self, r, &line, now),
        };
        // VRR runs the script with a fixed 60 s timeout (§2 step 5).
        let end = start + tool.duration_ms.min(60_000);
        self.routers[r].busy_until = end;
        let outcome = if tool.duration_ms > 60_000 {
            DiagOutcome::Fail(CS_RUNTIME, "Command execution failed: timeout".into())
        } else {
            // DPY prints "stdout&&stderr&&code"; DiagnosticsAnswer splits and trims.
            DiagOutcome::Output(DiagOutput {
                stdout: py_bytes_repr(tool.stdout.as_bytes()),
                stderr: py_bytes_repr(tool.stderr.as_bytes()),
                exitcode: tool.code.to_string(),
            })
        };
        (Some(r), outcome, start, end)
    }

    /// The diagnostics run of a job.
    pub fn diagnostic(&self, job: usize) -> Option<&Diagnostic> {
        self.diagnostics.get(&job)
    }

    /// How a pending diagnostics job stands at the current time.
    pub(super) fn diagnostics_status(&self, job: usize) -> Option<JobStatus> {
        let d = self.diagnostics.get(&job)?;
        (self.now_ms >= d.end_ms).then(|| finished(&d.outcome, d.end_ms))
    }
}

fn finished(o: &DiagOutcome, at_ms: Ms) -> JobStatus {
    match o {
        DiagOutcome::Output(_) => JobStatus::Succeeded { at_ms },
        DiagOutcome::Fail(cs, text) => JobStatus::Failed {
            at_ms,
            code: DIAG_FAIL_CODE,
            cs: *cs,
            text: text.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_repr_is_pythons() {
        assert_eq!(py_bytes_repr(b""), "b''");
        assert_eq!(py_bytes_repr(b"a\nb"), "b'a\\nb'");
        assert_eq!(py_bytes_repr(b"it's"), "b\"it's\"");
        assert_eq!(py_bytes_repr(b"\x01\\"), "b'\\x01\\\\'");
    }

    #[test]
    fn params_follow_has_valid_chars() {
        assert!(params_valid("-c 3 -f"));
        assert!(params_valid("-I eth0 -w 2.5"));
        assert!(!params_valid("-c 3; reboot"));
        assert!(!params_valid("$(id)"));
        assert!(!params_valid("-c=3"));
    }

    #[test]
    fn getopt_takes_inline_and_separate_values() {
        let (o, p) = getopt(&["10.0.0.1", "-c3", "-f", "-I", "eth0"], "f", "cI").unwrap();
        assert_eq!(p, vec!["10.0.0.1".to_string()]);
        assert_eq!(num(&o, 'c').unwrap(), Some(3));
        assert!(has(&o, 'f'));
        assert!(getopt(&["-x"], "f", "c").is_err());
    }
}
