//! Affinity groups and their members.

use crate::catalog::{AffinityGroup, AffinityType};

use super::{new_uuid, World, WorldError};

impl World {
    /// Creates an affinity group; names are unique per owner (account or project).
    pub fn add_affinity_group(
        &mut self,
        name: &str,
        kind: AffinityType,
        description: &str,
        account: usize,
        project: Option<usize>,
    ) -> Result<usize, WorldError> {
        let taken = self.affinity_groups.iter().any(|g| {
            !g.deleted
                && g.name == name
                && g.project == project
                && (project.is_some() || g.account == account)
        });
        if taken {
            return Err(WorldError::Conflict(format!(
                "Unable to create affinity group, a group with name {name} already exists."
            )));
        }
        self.affinity_groups.push(AffinityGroup {
            id: new_uuid(),
            name: name.to_string(),
            kind,
            description: description.to_string(),
            account,
            project,
            deleted: false,
        });
        Ok(self.affinity_groups.len() - 1)
    }

    /// A live affinity group by id.
    pub fn affinity_group_by_id(&self, id: &str) -> Option<usize> {
        self.affinity_groups
            .iter()
            .position(|g| !g.deleted && g.id == id)
    }

    /// Live, non-expunged VMs (indices) that are members of an affinity group.
    pub fn affinity_members(&self, group: usize) -> Vec<usize> {
        (0..self.vms.len())
            .filter(|i| {
                let vm = &self.vms[*i];
                !vm.removed && vm.affinity_groups.contains(&group)
            })
            .collect()
    }
}
