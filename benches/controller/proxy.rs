//! A latency-injecting TCP proxy for the soak: while [`Proxy::slow`] is set, every accepted
//! connection waits `connect_ms`
//! before it is connected upstream, then every chunk read in either direction is delivered a
//! random 50–200 ms (configurable) later, in order. Bytes pass untouched (TLS end to end), so
//! the shim sees a slow API server, not a different one. Each direction holds at most
//! [`QUEUE_CHUNKS`] chunks in flight (bounded: back-pressure, no unbounded buffering).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

const QUEUE_CHUNKS: usize = 64;
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct Delays {
    pub connect_ms: u64,
    pub chunk_min_ms: u64,
    pub chunk_max_ms: u64,
}

#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicU64,
    pub chunks: AtomicU64,
    pub bytes: AtomicU64,
    /// Delays apply only while this is set.
    pub slow: AtomicBool,
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub stats: Arc<ProxyStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start(upstream: String, delays: Delays) -> std::io::Result<Proxy> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stats = Arc::new(ProxyStats::default());
    let st = stats.clone();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((down, _)) = accepted else { continue };
                    st.connections.fetch_add(1, Ordering::Relaxed);
                    let (up, st) = (upstream.clone(), st.clone());
                    conns.spawn(async move {
                        if st.slow.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(delays.connect_ms)).await;
                        }
                        let Ok(up) = TcpStream::connect(&up).await else { return };
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        let (dr, dw) = down.into_split();
                        let (ur, uw) = up.into_split();
                        tokio::join!(pipe(dr, uw, delays, st.clone()), pipe(ur, dw, delays, st));
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(Proxy { addr, stats, task })
}

async fn pipe(r: OwnedReadHalf, mut w: OwnedWriteHalf, d: Delays, stats: Arc<ProxyStats>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let st = stats.clone();
    let reader = async move {
        let stats = st;
        loop {
            if r.readable().await.is_err() {
                break;
            }
            let mut buf = vec![0u8; CHUNK];
            match r.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    buf.truncate(n);
                    let delay = if stats.slow.load(Ordering::Relaxed) {
                        rand::random_range(d.chunk_min_ms..=d.chunk_max_ms)
                    } else {
                        0
                    };
                    let due = Instant::now() + Duration::from_millis(delay);
                    if tx.send((due, buf)).await.is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            }
        }
    };
    let writer = async move {
        let mut last = Instant::now();
        while let Some((due, buf)) = rx.recv().await {
            let due = due.max(last);
            tokio::time::sleep_until(due).await;
            last = due;
            stats.chunks.fetch_add(1, Ordering::Relaxed);
            stats.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
            if w.write_all(&buf).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}
