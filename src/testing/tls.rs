//! Test certificates: a certificate authority made at test time ([`TestCa`]) that issues
//! server and client certificates ([`CertPem`]), for servers started with TLS.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::fixture::FixtureError;

/// How long before "now" a certificate becomes valid: clocks of a test machine and a container
/// may differ a little.
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// How long a certificate stays valid: longer than any test run.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A certificate and its private key, PEM-encoded, as servers and clients read them
/// (etcd's `--cert-file`/`--key-file`, etcdctl's `--cert`/`--key`,
/// [`EtcdOptions::with_client_cert`](crate::EtcdOptions::with_client_cert)).
#[derive(Clone)]
pub struct CertPem {
    cert: String,
    key: String,
}

impl std::fmt::Debug for CertPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A test key is no secret, but a log full of PEM helps nobody.
        f.debug_struct("CertPem")
            .field("cert", &format_args!("{} bytes of PEM", self.cert.len()))
            .finish_non_exhaustive()
    }
}

impl CertPem {
    /// A certificate (or a chain, the certificate first) and its private key, both PEM.
    pub fn new(cert_pem: impl Into<String>, key_pem: impl Into<String>) -> Self {
        CertPem {
            cert: cert_pem.into(),
            key: key_pem.into(),
        }
    }

    /// The certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert
    }

    /// The private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> &str {
        &self.key
    }
}

/// A certificate authority made at test time: a self-signed CA certificate with an ECDSA
/// P-256 key, kept in memory, that issues server and client certificates.
///
/// Use it for tests of TLS setups, good and bad: a second `TestCa` is a CA the server does not
/// trust, and [`client_cert_valid`](Self::client_cert_valid) issues an expired certificate.
///
/// ```
/// # fn main() -> Result<(), baton::testing::FixtureError> {
/// use baton::testing::TestCa;
/// let ca = TestCa::generate("my test CA")?;
/// let server = ca.server_cert(&["127.0.0.1", "localhost"])?;
/// let client = ca.client_cert("app")?;
/// assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
/// # let _ = (server, client); Ok(()) }
/// ```
pub struct TestCa {
    name: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA whose certificate has the common name `name`, valid from an hour ago for a
    /// year.
    ///
    /// # Errors
    /// [`FixtureError::Certificate`] if the key or the certificate cannot be made.
    pub fn generate(name: &str) -> Result<TestCa, FixtureError> {
        let failed = |source: rcgen::Error| FixtureError::Certificate {
            name: name.to_owned(),
            source: Box::new(source),
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + VALIDITY).into();
        let key = KeyPair::generate().map_err(failed)?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(failed)?;
        Ok(TestCa {
            name: name.to_owned(),
            issuer,
        })
    }

    /// The CA's certificate, PEM: what clients trust (etcd's `--trusted-ca-file`, etcdctl's
    /// `--cacert`, [`EtcdOptions::with_ca_cert`](crate::EtcdOptions::with_ca_cert)).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (IP addresses or DNS names, e.g. `["127.0.0.1",
    /// "localhost"]`), valid from an hour ago for a year. It may also serve as a client
    /// certificate: etcd's gateway connects to etcd itself with it.
    ///
    /// # Errors
    /// [`FixtureError::Certificate`] for a name that is neither an IP address nor a DNS name,
    /// or if the certificate cannot be made.
    pub fn server_cert(&self, names: &[&str]) -> Result<CertPem, FixtureError> {
        let label = names.first().copied().unwrap_or("server");
        let now = SystemTime::now();
        self.issue(
            label,
            names,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            (now - BACKDATE, now + VALIDITY),
        )
    }

    /// A client certificate with the common name `name` (etcd takes it as the user when its
    /// authentication is on), valid from an hour ago for a year.
    ///
    /// # Errors
    /// [`FixtureError::Certificate`] if the certificate cannot be made.
    pub fn client_cert(&self, name: &str) -> Result<CertPem, FixtureError> {
        let now = SystemTime::now();
        self.client_cert_valid(name, now - BACKDATE, now + VALIDITY)
    }

    /// A client certificate with the common name `name`, valid from `not_before` to
    /// `not_after`: in the past for an expired certificate, in the future for one not valid
    /// yet.
    ///
    /// # Errors
    /// [`FixtureError::Certificate`] if the certificate cannot be made.
    pub fn client_cert_valid(
        &self,
        name: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<CertPem, FixtureError> {
        self.issue(
            name,
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
            (not_before, not_after),
        )
    }

    fn issue(
        &self,
        common_name: &str,
        names: &[&str],
        usages: &[ExtendedKeyUsagePurpose],
        (not_before, not_after): (SystemTime, SystemTime),
    ) -> Result<CertPem, FixtureError> {
        let failed = |source: rcgen::Error| FixtureError::Certificate {
            name: common_name.to_owned(),
            source: Box::new(source),
        };
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).map_err(failed)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        Ok(CertPem::new(cert.pem(), key.serialize_pem()))
    }
}

/// The certificates of a test server that serves TLS to its clients, PEM-encoded, and whether
/// it asks them for a client certificate; with the client certificate the fixture's own
/// clients present. `EtcdTls` and `RedisTls` name it for
/// each fixture (`EtcdNode::start_tls`, `RedisNode::start_tls`), with their examples.
#[derive(Debug, Clone)]
pub struct ServerTls {
    ca_pem: String,
    server: CertPem,
    client: Option<CertPem>,
    client_cert_auth: bool,
    /// The CA that made these certificates, when they were generated.
    ca: Option<Arc<TestCa>>,
}

impl ServerTls {
    /// The server presents `server` (its certificate and key), signed by the CA `ca_pem`.
    /// Client certificates are not asked for until
    /// [`with_client_cert_auth`](Self::with_client_cert_auth); then they must be signed by
    /// the same CA.
    pub fn new(ca_pem: impl Into<String>, server: CertPem) -> Self {
        ServerTls {
            ca_pem: ca_pem.into(),
            server,
            client: None,
            client_cert_auth: false,
            ca: None,
        }
    }

    /// A new CA (`baton test CA`), a server certificate for `127.0.0.1` and `localhost`, and a
    /// client certificate (common name `baton-test`) that the fixture's clients present;
    /// client certificates required.
    ///
    /// # Errors
    /// [`FixtureError::Certificate`] if a key or certificate cannot be made.
    pub fn generate() -> Result<Self, FixtureError> {
        let ca = TestCa::generate("baton test CA")?;
        let server = ca.server_cert(&["127.0.0.1", "localhost"])?;
        let client = ca.client_cert("baton-test")?;
        Ok(ServerTls {
            ca_pem: ca.cert_pem(),
            server,
            client: Some(client),
            client_cert_auth: true,
            ca: Some(Arc::new(ca)),
        })
    }

    /// Whether the server requires a client certificate signed by the CA (etcd's
    /// `--client-cert-auth`, with the CA as `--trusted-ca-file`: etcd asks for client
    /// certificates whenever it has a trusted CA, so without this it gets none; Redis's
    /// `--tls-auth-clients yes` or `no`).
    #[must_use]
    pub fn with_client_cert_auth(mut self, required: bool) -> Self {
        self.client_cert_auth = required;
        self
    }

    /// The client certificate the fixture's clients present (`EtcdNode::backend`,
    /// `RedisNode::backend` and `RedisNode::command`).
    #[must_use]
    pub fn with_client_cert(mut self, client: CertPem) -> Self {
        self.client = Some(client);
        self
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server's certificate and key.
    pub fn server_cert(&self) -> &CertPem {
        &self.server
    }

    /// The client certificate the fixture's clients present, if any.
    pub fn client_cert(&self) -> Option<&CertPem> {
        self.client.as_ref()
    }

    /// Whether the server requires client certificates.
    pub fn client_cert_auth(&self) -> bool {
        self.client_cert_auth
    }

    /// The CA that made the certificates, when they were [generated](Self::generate): to
    /// issue more (another client, an expired certificate).
    pub fn ca(&self) -> Option<&TestCa> {
        self.ca.as_deref()
    }

    /// Writes [`files`](Self::files) into `dir` (created, readable by its owner only; the
    /// files too: one of them is the server's key).
    #[cfg(any(feature = "etcd", feature = "redis"))]
    pub(super) fn write_files(&self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        for (name, pem) in self.files() {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(name))
                .and_then(|mut file| std::io::Write::write_all(&mut file, pem.as_bytes()))?;
        }
        Ok(())
    }

    /// The files the server reads, by name in its TLS directory.
    pub(super) fn files(&self) -> [(&'static str, &str); 3] {
        [
            (TLS_CA, &self.ca_pem),
            (TLS_CERT, self.server.cert_pem()),
            (TLS_KEY, self.server.key_pem()),
        ]
    }
}

pub(super) const TLS_CA: &str = "ca.pem";
pub(super) const TLS_CERT: &str = "server.pem";
pub(super) const TLS_KEY: &str = "server-key.pem";
/// Where a container finds the TLS files.
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
pub(super) const CONTAINER_TLS_DIR: &str = "/baton-tls";
