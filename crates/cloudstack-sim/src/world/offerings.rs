//! The catalogue a VM is made from: service offerings, templates and disk offerings.

use crate::catalog::{DiskOffering, ServiceOffering, Template};

use super::{unique_name, GuestKind, World, WorldError};

impl World {
    fn zone_refs(&self, refs: &[String]) -> Result<Vec<usize>, WorldError> {
        refs.iter()
            .map(|z| {
                self.zone_index(z)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown zone {z:?}")))
            })
            .collect()
    }

    /// Adds a service offering; `zones` (names or ids) restrict it, empty = every zone.
    pub fn add_service_offering(
        &mut self,
        name: &str,
        id: Option<&str>,
        cpu_number: u32,
        cpu_speed: u32,
        memory_mb: u32,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(
            &self.service_offerings,
            |o| &o.name,
            "service offering",
            name,
        )?;
        if cpu_number == 0 || memory_mb == 0 {
            return Err(WorldError::Invalid(format!(
                "service offering {name:?} needs at least 1 cpu and 1 MiB of memory"
            )));
        }
        let zones = self.zone_refs(zones)?;
        let id = self.check_id(id, "service offering", |i| {
            self.service_offerings.iter().any(|o| o.id == i)
        })?;
        self.service_offerings.push(ServiceOffering {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            cpu_number,
            cpu_speed,
            memory_mb,
            zones,
        });
        Ok(self.service_offerings.len() - 1)
    }

    pub fn service_offering_index(&self, name_or_id: &str) -> Option<usize> {
        self.service_offerings
            .iter()
            .position(|o| o.id == name_or_id || o.name == name_or_id)
    }

    /// Adds a ready template in `zones` (names or ids; empty = every zone).
    pub fn add_template(
        &mut self,
        name: &str,
        id: Option<&str>,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.templates, |t| &t.name, "template", name)?;
        let mut zones = self.zone_refs(zones)?;
        if zones.is_empty() {
            zones = (0..self.zones.len()).collect();
        }
        let id = self.check_id(id, "template", |i| self.templates.iter().any(|t| t.id == i))?;
        self.templates.push(Template {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            zones,
            size_bytes: 8 * 1024 * 1024 * 1024,
            guest: None,
        });
        Ok(self.templates.len() - 1)
    }

    /// Makes every VM deployed from template `idx` from now on (by `deployVirtualMachine` or
    /// [`World::add_vm`] with a healthy spec) boot `guest` (`None`: healthy again). A storm of
    /// one broken template: CloudStack deploys the template's image as it is and lists the
    /// template on each VM (`templateid`/`templatename`, `UserVmJoinDaoImpl.java@04a2f419`
    /// `newUserVmResponse`, details `tmpl`); nothing on the CloudStack side changes. VMs
    /// already running keep their guest.
    pub fn set_template_guest(
        &mut self,
        idx: usize,
        guest: Option<GuestKind>,
    ) -> Result<(), WorldError> {
        let t = self
            .templates
            .get_mut(idx)
            .ok_or_else(|| WorldError::NotFound(format!("no template #{idx}")))?;
        t.guest = guest;
        Ok(())
    }

    pub fn template_index(&self, name_or_id: &str) -> Option<usize> {
        self.templates
            .iter()
            .position(|t| t.id == name_or_id || t.name == name_or_id)
    }

    /// Adds a disk offering: a fixed size in GB, or `customized` (size given at deploy).
    pub fn add_disk_offering(
        &mut self,
        name: &str,
        id: Option<&str>,
        disk_size_gb: u64,
        customized: bool,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.disk_offerings, |d| &d.name, "disk offering", name)?;
        if !customized && disk_size_gb == 0 {
            return Err(WorldError::Invalid(format!(
                "disk offering {name:?} needs a size or customized: true"
            )));
        }
        let zones = self.zone_refs(zones)?;
        let id = self.check_id(id, "disk offering", |i| {
            self.disk_offerings.iter().any(|d| d.id == i)
        })?;
        self.disk_offerings.push(DiskOffering {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            disk_size_gb: if customized { 0 } else { disk_size_gb },
            customized,
            zones,
        });
        Ok(self.disk_offerings.len() - 1)
    }

    pub fn disk_offering_index(&self, name_or_id: &str) -> Option<usize> {
        self.disk_offerings
            .iter()
            .position(|d| d.id == name_or_id || d.name == name_or_id)
    }

    /// The offering a VM gets: the named one (it must serve the zone) or the first that does.
    pub(super) fn offering_for(&self, r: Option<&str>, zone: usize) -> Result<usize, WorldError> {
        let i = match r {
            Some(r) => self
                .service_offering_index(r)
                .ok_or_else(|| WorldError::NotFound(format!("unknown service offering {r:?}")))?,
            None => self
                .service_offerings
                .iter()
                .position(|o| o.in_zone(zone))
                .ok_or_else(|| WorldError::NotFound("no service offering for the zone".into()))?,
        };
        if !self.service_offerings[i].in_zone(zone) {
            return Err(WorldError::Invalid(format!(
                "service offering {:?} is not available in zone {:?}",
                self.service_offerings[i].name, self.zones[zone].name
            )));
        }
        Ok(i)
    }

    /// The template a VM gets: the named one (it must be in the zone) or the first that is.
    pub(super) fn template_for(&self, r: Option<&str>, zone: usize) -> Result<usize, WorldError> {
        let i = match r {
            Some(r) => self
                .template_index(r)
                .ok_or_else(|| WorldError::NotFound(format!("unknown template {r:?}")))?,
            None => self
                .templates
                .iter()
                .position(|t| t.zones.contains(&zone))
                .ok_or_else(|| WorldError::NotFound("no template in the zone".into()))?,
        };
        if !self.templates[i].zones.contains(&zone) {
            return Err(WorldError::Invalid(format!(
                "template {:?} is not in zone {:?}",
                self.templates[i].name, self.zones[zone].name
            )));
        }
        Ok(i)
    }

    // Lookups by UUID alone, as API parameters name objects (`*_index` also take names).

    pub fn service_offering_by_id(&self, id: &str) -> Option<usize> {
        self.service_offerings.iter().position(|o| o.id == id)
    }

    pub fn template_by_id(&self, id: &str) -> Option<usize> {
        self.templates.iter().position(|t| t.id == id)
    }

    pub fn disk_offering_by_id(&self, id: &str) -> Option<usize> {
        self.disk_offerings.iter().position(|d| d.id == id)
    }
}
