//! A TCP proxy that can turn into a black hole: it forwards normally, and on
//! [`Proxy::blackhole`] it keeps accepting bytes (on existing and new
//! connections alike) and answers nothing, as a dropped route or a failover does.
//! A clean shutdown of the server never shows what that does to a client; this
//! does. [`Proxy::restore`] forwards again: connections that lived through the
//! black hole lost bytes, so they are closed, and new ones go through.
//! [`Proxy::cutting`] instead resets a connection (both sides, RST) when the
//! client sends bytes a predicate picks: a node that dies at that point.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The proxy; stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    blackholed: watch::Sender<bool>,
    stop: CancellationToken,
    cuts: Arc<AtomicUsize>,
}

/// Picks the client's bytes at which [`Proxy::cutting`] resets a connection.
pub type Cut = fn(&[u8]) -> bool;

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::listen(upstream, None).await
    }

    /// As [`Proxy::start`], but a connection whose client sends bytes that
    /// `cut` picks is reset instead, both ways, those bytes never forwarded.
    pub async fn cutting(upstream: SocketAddr, cut: Cut) -> Self {
        Self::listen(upstream, Some(cut)).await
    }

    /// Connections [`Proxy::cutting`] has reset.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    async fn listen(upstream: SocketAddr, cut: Option<Cut>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (blackholed, state) = watch::channel(false);
        let stop = CancellationToken::new();
        let done = stop.clone();
        let cuts = Arc::new(AtomicUsize::new(0));
        let cut = cut.map(|cut| (cut, Arc::clone(&cuts)));
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = done.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                let cut = cut.clone();
                tokio::spawn(connection(
                    client,
                    upstream,
                    state.clone(),
                    done.clone(),
                    cut,
                ));
            }
        });
        Self {
            addr,
            blackholed,
            stop,
            cuts,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on every connection's bytes are read and dropped, and nothing
    /// is answered.
    pub fn blackhole(&self) {
        let _ = self.blackholed.send(true);
    }

    /// Forwards again; connections that lived through the black hole close.
    pub fn restore(&self) {
        let _ = self.blackholed.send(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut state: watch::Receiver<bool>,
    stop: CancellationToken,
    cut: Option<(Cut, Arc<AtomicUsize>)>,
) {
    let mut buf_in = vec![0u8; 16 * 1024];
    let mut buf_out = vec![0u8; 16 * 1024];
    let mut server: Option<TcpStream> = None;
    let mut lived_through = *state.borrow();
    if !lived_through {
        match TcpStream::connect(upstream).await {
            Ok(s) => server = Some(s),
            Err(_) => return,
        }
    }
    loop {
        let blackholed = *state.borrow();
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                if *state.borrow() {
                    lived_through = true;
                } else if lived_through {
                    return; // bytes were lost: close, as a reset route would
                }
            }
            read = client.read(&mut buf_in) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if cut.as_ref().is_some_and(|(cut, _)| cut(&buf_in[..n])) => {
                    if let Some((_, cuts)) = &cut {
                        cuts.fetch_add(1, Ordering::SeqCst);
                    }
                    // Closed with a zero linger: each side gets an RST.
                    let _ = client.set_zero_linger();
                    if let Some(server) = &server {
                        let _ = server.set_zero_linger();
                    }
                    return;
                }
                Ok(n) if !blackholed => {
                    if let Some(server) = server.as_mut()
                        && server.write_all(&buf_in[..n]).await.is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {} // swallowed
            },
            read = read_some(&mut server, &mut buf_out) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if !blackholed => {
                    if client.write_all(&buf_out[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {} // never answered
            },
        }
    }
}

async fn read_some(server: &mut Option<TcpStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    match server {
        Some(server) => server.read(buf).await,
        None => std::future::pending().await,
    }
}
