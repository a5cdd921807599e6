//! What baton writes: lines on standard output (a closed output is exit 141), text made safe
//! for one line, JSON strings, and the `--json` events of `lock` and `elect`.

use std::io::Write;

use crate::args::{Cli, Command};
use crate::failure::{Failure, exit};
use crate::hold::Held;

/// Writes one line to standard output; a closed output is exit code 141, like a pipe's
/// SIGPIPE, any other failure 74.
pub(crate) fn out(line: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => {
                Failure::new(exit::BROKEN_PIPE, "standard output was closed")
            }
            _ => Failure::new(exit::IO, format!("cannot write standard output: {e}")),
        })
}

/// Text made safe for one line of output: control characters (newlines included) escaped.
pub(crate) fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Where `--json` events go: standard error when a command runs (standard output is the
/// command's), standard output without one.
#[derive(Debug, Clone, Copy)]
enum EventStream {
    Stdout,
    Stderr,
}

/// `--json` of `lock` and `elect` (not `--listen`): one JSON object per line for each event
/// of the lock or leadership, each naming it (docs/cli.md). Off, it writes nothing.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    to: Option<EventStream>,
    /// The lock or election, as JSON.
    name: String,
}

impl Events {
    pub(crate) fn of(cli: &Cli) -> Events {
        let (on, name, with_command) = match &cli.command {
            Command::Lock {
                json,
                name,
                command,
                ..
            }
            | Command::Elect {
                json,
                listen: false,
                name,
                command,
                ..
            } => (*json, name.as_str(), !command.is_empty()),
            _ => (false, "", false),
        };
        Events {
            to: on.then_some(if with_command {
                EventStream::Stderr
            } else {
                EventStream::Stdout
            }),
            name: json_str(name),
        }
    }

    /// Whether the events are baton's standard output (no command): they replace the key and
    /// token lines.
    pub(crate) fn on_stdout(&self) -> bool {
        matches!(self.to, Some(EventStream::Stdout))
    }

    /// `{"event":<event>,"name":<name>,<fields>}`, each field's value already JSON. On
    /// standard output, a write that fails is the failure `out` makes of it (141, 74).
    pub(crate) fn emit(&self, event: &str, fields: &[(&str, String)]) -> Result<(), Failure> {
        let Some(to) = self.to else { return Ok(()) };
        let mut line = format!("{{\"event\":{},\"name\":{}", json_str(event), self.name);
        for (key, value) in fields {
            line.push_str(&format!(",{}:{value}", json_str(key)));
        }
        line.push('}');
        match to {
            EventStream::Stdout => out(&line),
            EventStream::Stderr => {
                // Not `eprintln!`, which panics when the reader is gone: the events are not
                // worth baton's life (nor the command's).
                let _ = writeln!(std::io::stderr(), "{line}");
                Ok(())
            }
        }
    }

    /// The lock or leadership is held: its key and token (and a leader's value).
    pub(crate) fn acquired(&self, held: &Held) -> Result<(), Failure> {
        let mut fields = vec![
            ("key", json_str(held.key())),
            ("token", held.token().to_string()),
        ];
        if let Held::Lead(l) = held {
            fields.push(("value", json_str(&String::from_utf8_lossy(l.value()))));
        }
        self.emit("acquired", &fields)
    }

    /// It was lost, and why.
    pub(crate) fn lost(&self, reason: &str) {
        let _ = self.emit("lost", &[("reason", json_str(reason))]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}
