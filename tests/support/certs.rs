//! Certificates made at test time for the TLS tests: nothing committed, so
//! nothing expires in the repository. One CA signs the servers' and the
//! client's certificates; a second, unrelated CA and an expired and a
//! wrong-host certificate are the failures a client must refuse.
//!
//! ECDSA P-256 keys through rcgen (ring): a set takes milliseconds, so each
//! test binary makes one, the first time it is asked for.

// Each includer (test binary, bench) uses a different subset.
#![allow(dead_code)]

use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::server::ServerTls;

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

#[derive(Debug)]
pub struct Certs {
    /// The CA the servers' and the client's certificates chain to.
    pub ca_pem: String,
    /// For 127.0.0.1 (and `localhost`), signed by `ca_pem`.
    pub server: Identity,
    /// A client certificate (extended key usage client auth), signed by `ca_pem`.
    pub client: Identity,
    /// Another CA, which signed nothing the servers present.
    pub other_ca_pem: String,
    /// A client certificate signed by `other_ca_pem`: a mutual-TLS server
    /// must refuse it.
    pub foreign_client: Identity,
    /// For 127.0.0.1, signed by `ca_pem`, expired in 2021.
    pub expired_server: Identity,
    /// For `wrong.example` only, signed by `ca_pem`.
    pub wrong_host_server: Identity,
    /// For 127.0.0.1 (and `localhost`), signed by `ca_pem`, for server and
    /// client authentication both: a TLS Redis Cluster node presents it on
    /// its client port and also as a client, to the other nodes' cluster
    /// bus (which always asks for a client certificate) and to its master.
    pub cluster_node: Identity,
}

impl Certs {
    /// A TLS server with `server` (no client certificate asked for).
    pub fn server(&self) -> ServerTls {
        self.server_with(&self.server, false)
    }

    /// A TLS server with `server` that asks for a client certificate signed
    /// by `ca_pem` (mutual TLS).
    pub fn mutual_server(&self) -> ServerTls {
        self.server_with(&self.server, true)
    }

    /// A TLS server presenting `identity`.
    pub fn server_with(&self, identity: &Identity, auth_clients: bool) -> ServerTls {
        ServerTls {
            cert_pem: identity.cert_pem.clone(),
            key_pem: identity.key_pem.clone(),
            ca_pem: self.ca_pem.clone(),
            auth_clients,
        }
    }

    /// The TLS of every node of a TLS Redis Cluster
    /// (`RedisCluster::start_tls`): `cluster_node`, whose certificate is
    /// valid for client authentication too, as the nodes' links to each
    /// other need. With `auth_clients`, clients must present a certificate
    /// signed by `ca_pem` (e.g. `client`).
    pub fn cluster_node(&self, auth_clients: bool) -> ServerTls {
        self.server_with(&self.cluster_node, auth_clients)
    }
}

/// The set for this test binary.
pub fn certs() -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| make().expect("making test certificates"))
}

fn make() -> Result<Certs, rcgen::Error> {
    let (ca, ca_pem) = new_ca("redfence test CA")?;
    let (other_ca, other_ca_pem) = new_ca("unrelated test CA")?;
    let server = |names: &[&str], expired: bool| -> Result<Identity, rcgen::Error> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        leaf(params, &ca)
    };
    let client = |issuer: &CertifiedIssuer<'static, KeyPair>| -> Result<Identity, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "redfence test client");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        leaf(params, issuer)
    };
    let cluster_node = {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "redfence test cluster node");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        leaf(params, &ca)?
    };
    Ok(Certs {
        cluster_node,
        server: server(&["127.0.0.1", "localhost"], false)?,
        expired_server: server(&["127.0.0.1", "localhost"], true)?,
        wrong_host_server: server(&["wrong.example"], false)?,
        client: client(&ca)?,
        foreign_client: client(&other_ca)?,
        ca_pem,
        other_ca_pem,
    })
}

fn new_ca(name: &str) -> Result<(CertifiedIssuer<'static, KeyPair>, String), rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let pem = issuer.pem();
    Ok((issuer, pem))
}

fn leaf(
    params: CertificateParams,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> Result<Identity, rcgen::Error> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Identity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}
