//! Failures and exit codes: every error ends as one line on standard error and an exit code
//! (docs/cli.md), the library's words turned into the command's flags.

use baton::Error;

use crate::output::one_line;

/// Exit codes, as documented in `EXIT_CODES` and docs/cli.md.
pub(crate) mod exit {
    pub(crate) const ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 64;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const IO: u8 = 74;
    pub(crate) const TIMEOUT: u8 = 75;
    pub(crate) const AUTH: u8 = 77;
    pub(crate) const CONFIG: u8 = 78;
    pub(crate) const LOST: u8 = 79;
    pub(crate) const NOT_EXECUTABLE: u8 = 126;
    pub(crate) const NOT_FOUND: u8 = 127;
    pub(crate) const BROKEN_PIPE: u8 = 141;
}

/// A failure to report: one line on stderr and an exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument(_)
            | Error::InvalidInput { .. }
            | Error::LimitMismatch { .. } => exit::USAGE,
            Error::Connect { .. }
            | Error::Backend { .. }
            | Error::OutcomeUnknown { .. }
            | Error::Unavailable => exit::UNAVAILABLE,
            Error::Auth { .. } => exit::AUTH,
            // The credentials were accepted: the role lacks a grant, which is the server's
            // configuration to fix (sysexits' EX_CONFIG), not a failed authentication.
            Error::Permission { .. }
            | Error::ForeignSchema { .. }
            | Error::Misconfigured { .. }
            | Error::UnsupportedVersion { .. }
            | Error::ServerSetting { .. }
            | Error::ForeignLayout { .. } => exit::CONFIG,
            Error::Locked { .. } | Error::RestartGrace { .. } => exit::TIMEOUT,
            Error::SessionLost(_)
            | Error::EntryGone { .. }
            | Error::NotOwner { .. }
            | Error::LeadershipLost { .. } => exit::LOST,
            _ => exit::ERROR,
        };
        Failure::new(code, one_line(&in_flags(&explain(&e))))
    }
}

/// The error and its causes, on one line: a cause that repeats what was said already (an
/// operating system's "Connection refused (os error 111)" after baton's "connection refused")
/// is left out, and of an etcd request's gRPC status only its message is kept.
fn explain(e: &Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = match cause.downcast_ref::<baton::etcd_client::Error>() {
            // etcd with authentication on, asked without a user: its words name no flag.
            Some(baton::etcd_client::Error::GRpcStatus(status))
                if status.message().contains("user name is empty") =>
            {
                "the server has authentication on and no user was given: give --user and \
                 --password (or BATON_USER and BATON_PASSWORD)"
                    .to_owned()
            }
            Some(baton::etcd_client::Error::GRpcStatus(status)) => status.message().to_owned(),
            _ => cause.to_string(),
        };
        let said = message.to_lowercase();
        let plain = text
            .split(" (os error")
            .next()
            .unwrap_or(&text)
            .to_lowercase();
        if !said.contains(&plain) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// The library's words for its options, as the command's flags (the library's messages name
/// the `EtcdOptions` / `ConnectOptions` setters).
const FLAGS: [(&str, &str); 7] = [
    ("the certificate of with_client_cert", "--cert"),
    ("the key of with_client_cert", "--key"),
    ("with_client_cert", "--cert and --key"),
    ("with_ca_cert", "--cacert"),
    (
        "name the host it is issued for: with_tls_server_name",
        "reach the server by a name it is issued for, in --endpoints",
    ),
    ("with_user", "--user and --password"),
    ("with_connect_timeout", "--connect-timeout"),
];

/// `text` with the library's option names replaced by the command's flags.
fn in_flags(text: &str) -> String {
    FLAGS
        .iter()
        .fold(text.to_owned(), |text, (api, flag)| text.replace(api, flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #38: a permission the role lacks is the server's configuration to fix (78),
    /// not a failed authentication (77); a URL that does not parse is a bad argument (64),
    /// not an unreachable server (69); a schema of someone else's is configuration (78).
    #[test]
    fn permission_and_bad_urls_have_their_own_exit_codes() {
        let code = |e: Error| Failure::from(e).code;
        assert_eq!(
            code(Error::Permission {
                source: "no".into()
            }),
            exit::CONFIG
        );
        assert_eq!(
            code(Error::Auth {
                source: "no".into()
            }),
            exit::AUTH
        );
        let bad_url = Error::InvalidInput {
            what: "the PostgreSQL URL `postgres://h:70000/db` does not parse".into(),
            source: None,
        };
        assert_eq!(code(bad_url), exit::USAGE);
        let foreign = Error::ForeignSchema {
            schema: "app".into(),
        };
        assert_eq!(code(foreign), exit::CONFIG);
    }

    /// A request whose answer was lost (the server stopped answering mid-request) is "cannot
    /// reach the backend, try again later", as a request that failed is: not "unexpected".
    #[test]
    fn a_lost_answer_exits_as_unreachable() {
        let lost = Error::OutcomeUnknown {
            op: "enqueue",
            at: Default::default(),
            source: "deadline has elapsed".into(),
        };
        assert_eq!(Failure::from(lost).code, exit::UNAVAILABLE);
    }
}
