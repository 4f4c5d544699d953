//! One job of a `listAsyncJobs` page (`AsyncJobResponse`,
//! `api/src/main/java/org/apache/cloudstack/api/response/AsyncJobResponse.java@252e1a73`;
//! `jobid` and `jobstatus` come from `BaseResponse`). The remnant report reads it for the error
//! of a VM's last failed destroy: CAPC retries a failing `destroyVirtualMachine` without saying
//! why anywhere Kubernetes shows.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{lenient, CsTime, ListItem};
use crate::error::{sanitize_text, MAX_ERRORTEXT_CHARS};

/// The command class of `destroyVirtualMachine`
/// (`api/src/main/java/org/apache/cloudstack/api/command/user/vm/DestroyVMCmd.java`); a job's
/// `cmd` is the class name of the command that queued it.
pub const DESTROY_VM_CMD: &str = "DestroyVMCmd";

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct AsyncJob {
    pub jobid: String,
    #[serde(default, deserialize_with = "lenient::string_opt")]
    pub cmd: Option<String>,
    /// 0 pending, 1 succeeded, 2 failed.
    #[serde(default, deserialize_with = "lenient::u64_opt")]
    pub jobstatus: Option<u64>,
    #[serde(default, deserialize_with = "lenient::string_opt")]
    pub jobinstancetype: Option<String>,
    #[serde(default, deserialize_with = "lenient::string_opt")]
    pub jobinstanceid: Option<String>,
    #[serde(default, deserialize_with = "lenient::time_opt")]
    pub created: Option<CsTime>,
    /// The result object, or `errorcode`/`errortext` of a failed job.
    #[serde(default)]
    pub jobresult: Option<Value>,
}

impl ListItem for AsyncJob {
    fn item_id(&self) -> Option<&str> {
        Some(&self.jobid)
    }
}

impl AsyncJob {
    fn destroys(&self, vm_id: &str) -> bool {
        // `DestroyVMCmd`, or `DestroyVMCmdByAdmin` for an admin's call.
        self.cmd.as_deref().is_some_and(|c| {
            c.rsplit('.')
                .next()
                .is_some_and(|class| class.starts_with(DESTROY_VM_CMD))
        }) && self
            .jobinstanceid
            .as_deref()
            .is_some_and(|id| id.trim().eq_ignore_ascii_case(vm_id))
    }

    /// The sanitized `errortext` of a failed job (`None` for any other).
    pub fn error_text(&self) -> Option<String> {
        if self.jobstatus != Some(2) {
            return None;
        }
        let text = match self.jobresult.as_ref().and_then(|r| r.get("errortext")) {
            Some(Value::String(s)) => sanitize_text(s, MAX_ERRORTEXT_CHARS),
            Some(Value::Null) | None => String::new(),
            Some(other) => sanitize_text(&other.to_string(), MAX_ERRORTEXT_CHARS),
        };
        Some(if text.is_empty() {
            crate::parse::JOB_FAILED_WITHOUT_TEXT.to_string()
        } else {
            text
        })
    }
}

/// The error of the last `destroyVirtualMachine` job of VM `vm_id` when that job failed; `None`
/// when there was none, or the last one succeeded or still runs. `jobs` in the listing's order
/// (by job id, oldest first: `QueryManagerImpl.java@57c33169` `searchForAsyncJobsInternal`);
/// a later `created` wins over that order.
pub fn last_failed_destroy(jobs: &[AsyncJob], vm_id: &str) -> Option<String> {
    let vm_id = vm_id.trim();
    jobs.iter()
        .enumerate()
        .filter(|(_, j)| j.destroys(vm_id))
        .max_by_key(|(i, j)| (j.created, *i))
        .and_then(|(_, j)| j.error_text())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(
        id: &str,
        cmd: &str,
        status: u64,
        vm: &str,
        created: &str,
        error: Option<&str>,
    ) -> AsyncJob {
        serde_json::from_value(json!({
            "jobid": id, "cmd": cmd, "jobstatus": status, "jobinstancetype": "VirtualMachine",
            "jobinstanceid": vm, "created": created,
            "jobresult": error.map(|e| json!({"errorcode": 530, "errortext": e})),
        }))
        .unwrap()
    }

    const DESTROY: &str = "org.apache.cloudstack.api.command.user.vm.DestroyVMCmd";

    #[test]
    fn the_last_destroy_of_the_vm_decides() {
        let jobs = [
            job(
                "1",
                DESTROY,
                2,
                "VM-A",
                "2026-12-01T10:00:00+0000",
                Some("first failure"),
            ),
            job(
                "2",
                "org.apache.cloudstack.api.command.user.vm.StartVMCmd",
                2,
                "vm-a",
                "2026-12-01T10:05:00+0000",
                Some("not a destroy"),
            ),
            job(
                "3",
                DESTROY,
                2,
                "vm-b",
                "2026-12-01T10:06:00+0000",
                Some("another VM"),
            ),
            job(
                "4",
                &format!("{DESTROY}ByAdmin"),
                2,
                "vm-a",
                "2026-12-01T10:07:00+0000",
                Some("Unable to destroy\u{1b}[31m vm-a"),
            ),
        ];
        assert_eq!(
            last_failed_destroy(&jobs, "vm-a").as_deref(),
            Some("Unable to destroy [31m vm-a")
        );
        let mut later_ok = jobs.to_vec();
        later_ok.push(job(
            "5",
            DESTROY,
            1,
            "vm-a",
            "2026-12-01T10:08:00+0000",
            None,
        ));
        assert_eq!(
            last_failed_destroy(&later_ok, "vm-a"),
            None,
            "the last one succeeded"
        );
        let mut pending = jobs.to_vec();
        pending.push(job(
            "6",
            DESTROY,
            0,
            "vm-a",
            "2026-12-01T10:09:00+0000",
            None,
        ));
        assert_eq!(
            last_failed_destroy(&pending, "vm-a"),
            None,
            "the last one still runs"
        );
        assert_eq!(last_failed_destroy(&jobs, "vm-c"), None);
    }

    #[test]
    fn a_job_with_fields_missing_reads_without_them() {
        // As in the recorded upstream answer (cloudstack-go testdata: no cmd, no jobstatus).
        let j: AsyncJob = serde_json::from_value(
            json!({"accountid": "a", "created": "2021-09-29T17:50:11+0530",
            "jobid": "6679e6b9", "jobprocstatus": 0, "jobresultcode": 0, "userid": "u"}),
        )
        .unwrap();
        assert_eq!(
            (j.cmd.clone(), j.jobstatus, j.error_text()),
            (None, None, None)
        );
        let failed: AsyncJob =
            serde_json::from_value(json!({"jobid": "x", "jobstatus": "2"})).unwrap();
        assert_eq!(
            failed.error_text().as_deref(),
            Some(crate::parse::JOB_FAILED_WITHOUT_TEXT)
        );
    }
}
