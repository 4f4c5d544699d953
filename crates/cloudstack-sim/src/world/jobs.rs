//! Async jobs: recording them and settling deploy jobs when their VM finishes starting.

use crate::catalog::{AsyncJob, JobCommand, JobStatus};

use super::{new_uuid, Ms, Vm, VmState, World};

impl World {
    /// Records a job submitted by `account` now; returns its index. Pending deploy jobs
    /// finish when their VM stops starting.
    pub fn add_job(
        &mut self,
        account: usize,
        command: JobCommand,
        instance_id: &str,
        status: JobStatus,
    ) -> usize {
        let idx = self.jobs.len();
        let id = new_uuid();
        if status == JobStatus::Pending {
            self.pending_jobs.push(idx);
        }
        self.job_by_id.insert(id.clone(), idx);
        self.jobs.push(AsyncJob {
            id,
            account,
            command,
            created_ms: self.now_ms,
            instance_id: instance_id.to_string(),
            status,
        });
        // A VM that is already past starting (startvm=false, failed placement) settles now.
        self.settle_jobs();
        idx
    }

    pub fn job(&self, idx: usize) -> Option<&AsyncJob> {
        self.jobs.get(idx)
    }

    pub fn job_index(&self, id: &str) -> Option<usize> {
        self.job_by_id.get(id).copied()
    }

    /// Finishes the deploy jobs whose VM is no longer starting.
    pub(super) fn settle_jobs(&mut self) {
        if self.pending_jobs.is_empty() {
            return;
        }
        let mut still = Vec::new();
        for j in std::mem::take(&mut self.pending_jobs) {
            let outcome = match self.jobs[j].command {
                JobCommand::DeployVm { vm } => self.vms.get(vm).and_then(deploy_outcome),
                // Finished when the tool would have ended (`diagnostics.rs`).
                JobCommand::RunDiagnostics { .. } => self.diagnostics_status(j),
                // Other jobs are finished when they are created.
                _ => Some(JobStatus::Succeeded { at_ms: self.now_ms }),
            };
            match outcome {
                Some(s) => self.jobs[j].status = s,
                None => still.push(j),
            }
        }
        self.pending_jobs = still;
    }
}

/// How a deploy job ends, judged from its VM: `None` while the VM is still starting.
fn deploy_outcome(vm: &Vm) -> Option<JobStatus> {
    let at_ms = vm.last_updated_ms;
    match vm.state {
        _ if vm.removed => Some(destroyed_before_start(vm, at_ms)),
        VmState::Starting => None,
        VmState::Running | VmState::Migrating | VmState::Stopped => {
            Some(JobStatus::Succeeded { at_ms })
        }
        VmState::Error => Some(JobStatus::Failed {
            at_ms,
            code: 533,
            cs: 4325,
            text: format!(
                "Unable to create a deployment for VM instance {{\"instanceName\":\"i-2-{}-VM\",\"uuid\":\"{}\"}}",
                vm.seq, vm.id
            ),
        }),
        VmState::Destroyed | VmState::Expunging => Some(destroyed_before_start(vm, at_ms)),
    }
}

fn destroyed_before_start(vm: &Vm, at_ms: Ms) -> JobStatus {
    JobStatus::Failed {
        at_ms,
        code: 530,
        cs: 4250,
        text: format!("VM {} was destroyed before its start completed", vm.name),
    }
}
