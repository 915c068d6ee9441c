//! How the coordinator reaches PostgreSQL over TLS, in libpq's words: the URL's `sslmode`
//! (`disable`, `prefer` the default, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert` (a PEM file of the CAs to trust). As libpq does, `prefer` and `require`
//! encrypt without checking who answers; `verify-ca` checks the server's certificate against
//! `sslrootcert`'s CAs alone (required: any public CA's certificate, for any name, would
//! pass otherwise), and `verify-full` its host name too, against `sslrootcert`'s CAs or,
//! without it, the system's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// What the URL asked for TLS, and the URL without the parameters tokio-postgres does not
/// know.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    url: String,
    /// `None` where the URL said nothing (or is a `key=value` string, whose `sslmode`
    /// tokio-postgres reads itself).
    mode: Option<Mode>,
    root_cert: Option<PathBuf>,
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query (a `key=value` connection string
/// is left to tokio-postgres, which knows `disable`, `prefer` and `require`).
fn asked(url: &str) -> Result<Asked, String> {
    let mut asked = Asked {
        url: url.to_string(),
        mode: None,
        root_cert: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok(asked);
    };
    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Ok(asked);
    }
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => {
                asked.mode = Some(match v {
                    "disable" => Mode::Disable,
                    "prefer" | "allow" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(format!(
                            "sslmode `{other}` is not one of disable, prefer, require, \
                             verify-ca, verify-full"
                        ));
                    }
                })
            }
            "sslrootcert" => asked.root_cert = Some(PathBuf::from(percent_decoded(v))),
            _ => kept.push(pair),
        }
    }
    asked.url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(asked)
}

/// `%2F` and friends, as a path in a URL's query is written.
fn percent_decoded(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Mode {
    /// The mode tokio-postgres read from a `key=value` string (it knows three).
    fn of(mode: SslMode) -> Mode {
        match mode {
            SslMode::Disable => Mode::Disable,
            SslMode::Require => Mode::Require,
            _ => Mode::Prefer,
        }
    }

    /// What tokio-postgres is told: whether TLS is tried, and whether it is required.
    fn ssl_mode(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The connection settings and TLS connector a database URL asks for: a URL's `sslmode` in
/// libpq's words, else what tokio-postgres read (a `key=value` string's, or its default,
/// `prefer`).
pub fn resolve(url: &str) -> Result<(tokio_postgres::Config, MakeRustlsConnect), String> {
    let (config, mode, root_cert) = settings(url)?;
    Ok((config, connector(mode, root_cert.as_deref())?))
}

fn settings(url: &str) -> Result<(tokio_postgres::Config, Mode, Option<PathBuf>), String> {
    let asked = asked(url)?;
    let mut config: tokio_postgres::Config = asked
        .url
        .parse()
        .map_err(|e: tokio_postgres::Error| e.to_string())?;
    let mode = match asked.mode {
        Some(m) => {
            config.ssl_mode(m.ssl_mode());
            m
        }
        None => Mode::of(config.get_ssl_mode()),
    };
    Ok((config, mode, asked.root_cert))
}

/// The connector for `mode`: the system's CAs and `root_cert`'s where the server is checked.
fn connector(mode: Mode, root_cert: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let config = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Relaxed {
                chain: None,
                provider,
            }))
            .with_no_client_auth(),
        Mode::VerifyCa | Mode::VerifyFull => {
            let mut roots = rustls::RootCertStore::empty();
            match root_cert {
                None if mode == Mode::VerifyCa => {
                    return Err(
                        "sslmode verify-ca checks the server against sslrootcert's CAs \
                                alone: give sslrootcert=/path/to/ca.pem (or use verify-full, \
                                which checks the host name against the system's CAs)"
                            .to_string(),
                    );
                }
                None => {
                    let native = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(native.certs);
                }
                Some(_) => {}
            }
            if let Some(path) = root_cert {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "sslrootcert {}: holds no PEM certificate",
                        path.display()
                    ));
                }
                for c in certs {
                    roots
                        .add(c)
                        .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                }
            }
            if roots.is_empty() {
                return Err(
                    "sslmode verify-ca/verify-full: no CA to check the server against (give \
                     sslrootcert=/path/to/ca.pem)"
                        .to_string(),
                );
            }
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots.into(),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("TLS: {e}"))?;
            let verifier: Arc<dyn ServerCertVerifier> = if mode == Mode::VerifyCa {
                Arc::new(Relaxed {
                    chain: Some(webpki),
                    provider,
                })
            } else {
                webpki
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `prefer` and `require` (no chain: encrypted, whoever answers, libpq's meaning of them)
/// and `verify-ca` (the chain checked against `sslrootcert`, the host name not). The
/// handshake's signatures are checked against the certificate presented either way.
#[derive(Debug)]
struct Relaxed {
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_words_are_taken_out_of_the_url() {
        let a = asked("postgres://u:p@db:5432/hr?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x")
            .expect("parsed");
        assert_eq!(a.mode, Some(Mode::VerifyFull));
        assert_eq!(a.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(a.url, "postgres://u:p@db:5432/hr?application_name=x");
        let plain = asked("postgres://u@db/hr").expect("parsed");
        assert_eq!(
            (plain.mode, plain.url.as_str()),
            (None, "postgres://u@db/hr")
        );
        assert_eq!(
            asked("postgres://u@db/hr?sslmode=disable")
                .expect("parsed")
                .mode,
            Some(Mode::Disable)
        );
        // A key=value string is tokio-postgres's to read, its sslmode included.
        let kv = asked("host=db sslmode=require").expect("parsed");
        assert_eq!(
            (kv.mode, kv.url.as_str()),
            (None, "host=db sslmode=require")
        );
        assert_eq!(Mode::of(SslMode::Require), Mode::Require);
        let (config, mode, _) = settings("host=db sslmode=require").expect("parsed");
        assert_eq!(
            (mode, config.get_ssl_mode()),
            (Mode::Require, SslMode::Require)
        );
        let (config, mode, ca) =
            settings("postgres://u@db/hr?sslmode=verify-ca&sslrootcert=ca.pem").expect("parsed");
        assert_eq!(
            (mode, config.get_ssl_mode(), ca.as_deref()),
            (Mode::VerifyCa, SslMode::Require, Some(Path::new("ca.pem")))
        );
        // verify-ca without its CAs would take any public certificate: refused.
        let e = connector(Mode::VerifyCa, None).err().expect("refused");
        assert!(e.contains("sslrootcert"), "{e}");
        let e = asked("postgres://u@db/hr?sslmode=verify-everything").expect_err("refused");
        assert!(e.contains("verify-everything"), "{e}");
        assert_eq!(Mode::VerifyCa.ssl_mode(), SslMode::Require);
    }
}
