//! TLS to PostgreSQL: libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` read from the
//! connection string (tokio-postgres knows only part of them), or the options' PEMs; rustls
//! on ring, as for etcd and Redis (docs/design.md, 2026-11-26).
//!
//! baton encrypts only when `sslmode` asks for it, and then always checks the server's
//! certificate chain (against the CA given, or the system's roots): `require` and
//! `verify-ca` check the chain, `verify-full` the chain and the host name. libpq's `require`
//! checks nothing unless a root certificate file exists; baton's is `verify-ca`.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

pub(super) use crate::backend::tls::TlsFiles;
use crate::backend::tls::{Refused, Wording, certificates, client_identity};
use crate::error::{Error, Result};

/// libpq's TLS parameters as a connection string gave them (values decoded).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Params {
    mode: Option<String>,
    rootcert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    /// Not libpq's nor TLS: baton's own `baton_schema`, taken out with them so that a URL
    /// (the CLI's) can name the schema ([`PgOptions::with_schema`](super::PgOptions::with_schema)).
    pub(super) schema: Option<String>,
}

impl Params {
    fn slot(&mut self, name: &str) -> Option<&mut Option<String>> {
        match name {
            "sslmode" => Some(&mut self.mode),
            "sslrootcert" => Some(&mut self.rootcert),
            "sslcert" => Some(&mut self.cert),
            "sslkey" => Some(&mut self.key),
            "baton_schema" => Some(&mut self.schema),
            _ => None,
        }
    }
}

/// Takes libpq's TLS parameters out of `conn` (a `postgres://` URL's query, or a `key=value`
/// connection string) and returns the rest, for tokio-postgres, with them.
pub(super) fn take_params(conn: &str) -> (String, Params) {
    let mut params = Params::default();
    if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        let Some((base, query)) = conn.split_once('?') else {
            return (conn.to_owned(), params);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                match params.slot(&percent_decode(name)) {
                    Some(slot) => {
                        *slot = Some(percent_decode(value));
                        false
                    }
                    None => true,
                }
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, params);
    }
    let mut kept = Vec::new();
    for word in words(conn) {
        let taken = word.split_once('=').and_then(|(name, value)| {
            let slot = params.slot(name.trim())?;
            *slot = Some(unquote(value.trim()));
            Some(())
        });
        if taken.is_none() {
            kept.push(word);
        }
    }
    (kept.join(" "), params)
}

/// The `key=value` words of a connection string: split at white space outside single quotes
/// (a backslash escapes the next character), each kept as written.
fn words(conn: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in conn.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '\'' {
            quoted = !quoted;
        } else if c.is_whitespace() && !quoted {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        word.push(c);
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A `key=value` string's value without its quotes and escapes.
fn unquote(value: &str) -> String {
    let inner = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or(value);
    let mut out = String::new();
    let mut escaped = false;
    for c in inner.chars() {
        if !escaped && c == '\\' {
            escaped = true;
            continue;
        }
        escaped = false;
        out.push(c);
    }
    out
}

/// `%XX` decoded (and `+` left alone, as libpq does); invalid escapes kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How a connection is made: tokio-postgres's mode and the connector it uses when that mode
/// is TLS.
#[derive(Clone)]
pub(super) struct Setup {
    pub(super) mode: SslMode,
    pub(super) connector: MakeRustlsConnect,
}

impl Setup {
    /// Whether connections are plain text.
    pub(super) fn is_plain(&self) -> bool {
        self.mode == SslMode::Disable
    }
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup").field("mode", &self.mode).finish()
    }
}

/// What the connection string's `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    /// The chain checked, not the host name.
    VerifyCa,
    VerifyFull,
}

const NEED_SSLMODE: &str = "a CA or a client certificate (with_ca_cert, with_client_cert, \
     sslrootcert, sslcert, sslkey) needs TLS: sslmode=verify-full, verify-ca or require";

impl Setup {
    /// Checks `params` and `options` together (what can be checked without the server: the
    /// mode, the files, the PEMs, the key against its certificate) and builds the connector.
    pub(super) fn new(params: &Params, options: &TlsFiles) -> Result<Setup> {
        let mode = match params.mode.as_deref() {
            None | Some("disable" | "allow" | "prefer") => Mode::Plain,
            Some("require" | "verify-ca") => Mode::VerifyCa,
            Some("verify-full") => Mode::VerifyFull,
            Some(_) => {
                return Err(Error::InvalidArgument(
                    "sslmode must be disable, allow, prefer (all plain text in baton), \
                     require, verify-ca or verify-full",
                ));
            }
        };
        let ca = match (&options.ca, &params.rootcert) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "the CA is given twice: with_ca_cert and sslrootcert; give one",
                ));
            }
            (Some(pem), None) => Some(pem.clone()),
            (None, Some(path)) if path == "system" => None,
            (None, Some(path)) => Some(read_file("sslrootcert", path)?),
            (None, None) => None,
        };
        let identity = match (&options.identity, &params.cert, &params.key) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(Error::InvalidArgument(
                    "the client certificate is given twice: with_client_cert and \
                     sslcert/sslkey; give one",
                ));
            }
            (Some(pair), None, None) => Some(pair.clone()),
            (None, Some(cert), Some(key)) => {
                Some((read_file("sslcert", cert)?, read_file("sslkey", key)?))
            }
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(Error::InvalidArgument(
                    "sslcert and sslkey go together: the client certificate and its key",
                ));
            }
            (None, None, None) => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::InvalidArgument("the TLS library offers no protocol version"))?;
        if mode == Mode::Plain {
            if ca.is_some() || identity.is_some() || params.rootcert.is_some() {
                return Err(Error::InvalidArgument(NEED_SSLMODE));
            }
            // Never used: tokio-postgres is told not to ask for TLS.
            let config = builder
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth();
            return Ok(Setup {
                mode: SslMode::Disable,
                connector: MakeRustlsConnect::new(config),
            });
        }
        let roots = match &ca {
            Some(pem) => certificates(
                pem,
                "the CA certificate (with_ca_cert or sslrootcert) holds no PEM certificate",
            )?,
            None => {
                let system = rustls_native_certs::load_native_certs().certs;
                if system.is_empty() {
                    return Err(Error::InvalidArgument(
                        "TLS without a CA certificate (with_ca_cert, sslrootcert) trusts the \
                         system's roots, and this system has none",
                    ));
                }
                system
            }
        };
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(roots);
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|_| {
                Error::InvalidArgument("the CA certificates hold no usable trust anchor")
            })?;
        let builder = if mode == Mode::VerifyFull {
            builder.with_webpki_verifier(verifier)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
        };
        let mut config = match identity {
            Some((cert, key)) => {
                let (chain, key) = client_identity(&cert, &key)?;
                builder.with_client_auth_cert(chain, key).map_err(|_| {
                    Error::InvalidArgument("the client key is not a key type TLS supports")
                })?
            }
            None => builder.with_no_client_auth(),
        };
        // As libpq 17: the protocol's name, which a server taking direct TLS connections
        // (`sslnegotiation=direct`) requires, and older servers ignore.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Setup {
            mode: SslMode::Require,
            connector: MakeRustlsConnect::new(config),
        })
    }
}

/// A file the connection string names, read; a file that cannot be read is
/// [`Error::Misconfigured`], naming the parameter and the path.
fn read_file(param: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Misconfigured {
        endpoints: Vec::new(),
        source: format!("{param}={path}: {e}").into(),
    })
}

/// `verify-ca`: the chain checked as for `verify-full`, the host name not. (rustls's verifier
/// checks the name after the chain: a certificate refused for its name has a trusted chain.)
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
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
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// How the TLS errors of a PostgreSQL server are told.
const WORDING: Wording = Wording {
    wrong_host: "the server's TLS certificate is not issued for the host connected to \
                 (sslmode=verify-full checks it: connect to a name the certificate names, \
                 with hostaddr= for its address, or use sslmode=verify-ca)",
    not_tls: "the server's answer is not TLS",
};

/// A connection failure that retrying cannot fix, in words: a certificate refused by either
/// side, or a server that does not offer TLS. `None` for anything else.
pub(super) fn refused(error: &tokio_postgres::Error, endpoints: Vec<String>) -> Option<Error> {
    let source = std::error::Error::source(error);
    if source.is_some_and(|s| s.to_string() == "server does not support TLS") {
        return Some(Error::Misconfigured {
            endpoints,
            source: "the server does not offer TLS (ssl = off), and sslmode asks for it".into(),
        });
    }
    Some(Refused::in_chain(error, WORDING)?.misconfigured(endpoints))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: Option<&str>, rootcert: Option<&str>) -> Params {
        Params {
            mode: mode.map(str::to_owned),
            rootcert: rootcert.map(str::to_owned),
            ..Params::default()
        }
    }

    #[test]
    fn tls_parameters_are_taken_out_of_a_url() {
        let (rest, p) = take_params(
            "postgres://u:p@db.internal:5433/app?application_name=x&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca%20bundle.pem&connect_timeout=3",
        );
        assert_eq!(
            rest,
            "postgres://u:p@db.internal:5433/app?application_name=x&connect_timeout=3"
        );
        assert_eq!(p.mode.as_deref(), Some("verify-full"));
        assert_eq!(p.rootcert.as_deref(), Some("/etc/ca bundle.pem"));
        let (rest, p) = take_params("postgresql://h/db?sslmode=require");
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(p.mode.as_deref(), Some("require"));
        let (rest, p) = take_params("postgres://h/db");
        assert_eq!((rest.as_str(), p), ("postgres://h/db", Params::default()));
    }

    #[test]
    fn tls_parameters_are_taken_out_of_a_key_value_string() {
        let (rest, p) = take_params(
            "host=h user=app sslmode=verify-ca sslcert='/a b/c.pem' sslkey=/k.pem \
             password='it''s' options='-c x=1'",
        );
        assert_eq!(rest, "host=h user=app password='it''s' options='-c x=1'");
        assert_eq!(p.mode.as_deref(), Some("verify-ca"));
        assert_eq!(p.cert.as_deref(), Some("/a b/c.pem"));
        assert_eq!(p.key.as_deref(), Some("/k.pem"));
    }

    #[cfg(feature = "testing")]
    #[test]
    fn modes_map_to_plain_text_or_checked_tls() {
        let mode = |m: Option<&str>| Setup::new(&params(m, None), &TlsFiles::default());
        for plain in [None, Some("disable"), Some("allow"), Some("prefer")] {
            assert_eq!(mode(plain).map(|s| s.mode).ok(), Some(SslMode::Disable));
        }
        let ca = TlsFiles {
            ca: Some(
                crate::testing::TestCa::generate("t")
                    .map(|c| c.cert_pem().into_bytes())
                    .unwrap_or_default(),
            ),
            identity: None,
        };
        for tls in ["require", "verify-ca", "verify-full"] {
            let setup = Setup::new(&params(Some(tls), None), &ca);
            assert_eq!(setup.map(|s| s.mode).ok(), Some(SslMode::Require), "{tls}");
        }
        assert!(matches!(
            mode(Some("verify_full")),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn tls_options_without_tls_and_twice_given_are_refused() {
        let ca = TlsFiles {
            ca: Some(b"pem".to_vec()),
            identity: None,
        };
        for m in [None, Some("prefer")] {
            match Setup::new(&params(m, None), &ca) {
                Err(Error::InvalidArgument(msg)) => assert_eq!(msg, NEED_SSLMODE),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            Setup::new(&params(Some("verify-full"), Some("/x")), &ca),
            Err(Error::InvalidArgument(m)) if m.contains("twice")
        ));
        let half = Params {
            mode: Some("require".into()),
            cert: Some("/c".into()),
            ..Params::default()
        };
        assert!(matches!(
            Setup::new(&half, &TlsFiles::default()),
            Err(Error::InvalidArgument(m)) if m.contains("together")
        ));
        assert!(matches!(
            Setup::new(&params(Some("require"), Some("/no/such/ca.pem")), &TlsFiles::default()),
            Err(Error::Misconfigured { source, .. }) if source.to_string().contains("sslrootcert=/no/such/ca.pem")
        ));
    }
}
