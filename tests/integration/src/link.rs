//! TCP relays a test can cut, black-hole and heal: network partitions without network
//! namespaces (`Link` closes sockets, `DroppingLink` drops every byte and keeps them open).

use anyhow::Result;

/// A TCP relay between an agent and a coordinator whose link a test can cut and heal: a
/// network partition without network namespaces.
pub struct Link {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Link {
    pub fn new(target: u16) -> Result<Self> {
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>> = Default::default();
        let (c, k) = (cut.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if c.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                if let Ok(mut list) = k.lock() {
                    list.extend(client.try_clone().ok());
                    list.extend(server.try_clone().ok());
                }
                for (mut from, mut to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self { port, cut, conns })
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut list) = self.conns.lock() {
            for s in list.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A TCP relay that can black-hole the link: sockets stay open and new connections are
/// accepted, but no byte is forwarded either way (a partition that drops packets, where
/// nothing fails fast; unlike [`Link::cut`], which closes sockets).
pub struct DroppingLink {
    pub port: u16,
    dropping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl DroppingLink {
    pub fn new(target: u16) -> Result<Self> {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let dropping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = dropping.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let d = d.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if !d.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err()
                                    {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self { port, dropping })
    }

    /// From now on every byte either way is dropped; sockets stay open.
    pub fn drop_packets(&self) {
        self.dropping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.dropping
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
