//! Which workload kubeconfigs the shim uses: inline credentials only (pure).

/// A workload kubeconfig may carry only inline credentials. Whoever can write a
/// `<cluster>-kubeconfig` Secret must not make the shim run a command (`exec`), call out to an
/// auth provider (`auth-provider`) or read a file of its own container (`tokenFile`, certificate
/// and key paths: its ServiceAccount token among them). CAPI writes inline data only.
pub fn refuse_local_credentials(k: &kube::config::Kubeconfig) -> Result<(), String> {
    for named in &k.auth_infos {
        let Some(a) = &named.auth_info else { continue };
        let user = &named.name;
        let stanza = if a.exec.is_some() {
            Some("exec (it would run a command in the shim's container)")
        } else if a.auth_provider.is_some() {
            Some("auth-provider")
        } else if a.token_file.is_some() {
            Some("tokenFile (it would read a file of the shim's container)")
        } else if a.client_certificate.is_some() || a.client_key.is_some() {
            Some("client-certificate/client-key file paths (use the -data fields)")
        } else {
            None
        };
        if let Some(stanza) = stanza {
            return Err(format!(
                "user {user:?} uses {stanza}; the shim accepts only inline credentials and \
                 did not use it"
            ));
        }
    }
    for named in &k.clusters {
        if named
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "cluster {:?} names a certificate-authority file (use certificate-authority-data); \
                 the shim did not use it",
                named.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str, cluster: &str) -> kube::config::Kubeconfig {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters:\n- name: w\n  cluster:\n    server: https://10.0.0.1:6443\n{cluster}\
             users:\n- name: admin\n  user:\n{user}\
             contexts:\n- name: c\n  context: {{cluster: w, user: admin}}\n"
        );
        kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig")
    }

    #[test]
    fn a_workload_kubeconfig_with_inline_credentials_is_used() {
        let k = kubeconfig(
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5\n",
            "    certificate-authority-data: Y2E=\n",
        );
        assert_eq!(refuse_local_credentials(&k), Ok(()));
        let k = kubeconfig("    token: abc\n", "");
        assert_eq!(refuse_local_credentials(&k), Ok(()));
    }

    #[test]
    fn a_workload_kubeconfig_that_would_run_or_read_something_is_refused() {
        for (user, cluster, says) in [
            (
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'touch /tmp/owned']\n",
                "",
                "exec",
            ),
            (
                "    auth-provider:\n      name: oidc\n      config: {}\n",
                "",
                "auth-provider",
            ),
            (
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "",
                "tokenFile",
            ),
            (
                "    client-certificate: /etc/ssl/c.pem\n    client-key: /etc/ssl/k.pem\n",
                "",
                "client-certificate",
            ),
            (
                "    token: abc\n",
                "    certificate-authority: /etc/ssl/ca.pem\n",
                "certificate-authority file",
            ),
        ] {
            let e = refuse_local_credentials(&kubeconfig(user, cluster)).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
            assert!(!e.contains("touch") && !e.contains("/var/run"), "{e}");
        }
    }
}
