//! The loopback partition proxy of `baton::testing`, started the way a test wants it (a
//! failure to start is the test's failure).

/// [`baton::testing::Proxy`], started or the test fails.
pub struct Proxy(baton::testing::Proxy);

impl Proxy {
    /// A proxy in front of `upstream` (`ip:port` or `http://ip:port`, on 127.0.0.1).
    pub async fn start(upstream: &str) -> Proxy {
        Proxy(
            baton::testing::Proxy::start(upstream)
                .await
                .expect("a proxy on 127.0.0.1"),
        )
    }
}

impl std::ops::Deref for Proxy {
    type Target = baton::testing::Proxy;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
