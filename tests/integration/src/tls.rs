//! A TLS front for a coordinator, as a lab's proxy or ingress puts one: a certificate for
//! `localhost` and `127.0.0.1` signed by a CA of the test's own (its PEM in `ca_file`), and a
//! relay of each connection's plain bytes to the coordinator.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

pub struct TlsFront {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA that signed the front's certificate, in PEM.
    pub ca_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TlsFront {
    /// A front for the plain HTTP server at `target` (`127.0.0.1:PORT`); its CA's PEM is
    /// written in `dir`.
    pub fn start(target: &str, dir: &std::path::Path) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "headroom test CA");
        let ca = ca_params.self_signed(&ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.pem())?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .context("the front's TLS configuration")?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
        let target = target.to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let relay = async {
                    while let Ok((client, _)) = listener.accept().await {
                        let (acceptor, target) = (acceptor.clone(), target.clone());
                        tokio::spawn(async move {
                            let Ok(mut tls) = acceptor.accept(client).await else {
                                return;
                            };
                            let Ok(mut server) = tokio::net::TcpStream::connect(&target).await
                            else {
                                return;
                            };
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                        });
                    }
                };
                tokio::select! {
                    _ = relay => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self {
            url,
            ca_file,
            stop: Some(stop),
        })
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
