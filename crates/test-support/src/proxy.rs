//! A TCP proxy on loopback whose connection can be cut (listener closed, live connections
//! dropped) and restored on the same port: a network partition between a process and the
//! API server, or between the shim and CloudStack.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub struct CutProxy {
    pub port: u16,
    on: watch::Sender<bool>,
    accepted: Arc<AtomicU64>,
}

impl CutProxy {
    /// Starts forwarding 127.0.0.1:<port> to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy bind");
        let port = listener.local_addr().expect("bound").port();
        let (on, mut rx) = watch::channel(true);
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut first = Some(listener);
            loop {
                if rx.wait_for(|on| *on).await.is_err() {
                    return;
                }
                let listener = match first.take() {
                    Some(l) => l,
                    None => rebind(port).await,
                };
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        changed = rx.changed() => {
                            if changed.is_err() || !*rx.borrow() { break; }
                        }
                        acc = listener.accept() => {
                            let Ok((mut down, _)) = acc else { continue };
                            count.fetch_add(1, Ordering::SeqCst);
                            let upstream = upstream.clone();
                            conns.spawn(async move {
                                if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                                }
                            });
                        }
                    }
                }
                drop(listener);
                conns.abort_all();
                while conns.join_next().await.is_some() {}
            }
        });
        Self { port, on, accepted }
    }

    /// Closes the listener and drops every connection.
    pub fn cut(&self) {
        self.on.send_replace(false);
    }

    /// Listens again on the same port.
    pub fn restore(&self) {
        self.on.send_replace(true);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// A copy of the test API server's kubeconfig (same CA, same token) whose server is this
    /// proxy, written into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let text =
            std::fs::read_to_string(crate::apiserver::kubeconfig_path()).expect("kubeconfig");
        let url = crate::apiserver::url();
        assert!(text.contains(&url));
        let proxied = text.replace(&url, &format!("https://127.0.0.1:{}", self.port));
        let path = dir.join("kubeconfig-via-proxy");
        std::fs::write(&path, proxied).expect("write kubeconfig");
        path
    }
}

/// Binds the proxy's port again after a cut (the old socket may linger for a moment).
async fn rebind(port: u16) -> tokio::net::TcpListener {
    let mut tries = 0;
    loop {
        match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => return l,
            Err(e) => {
                tries += 1;
                assert!(tries < 100, "proxy cannot listen on {port} again: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
