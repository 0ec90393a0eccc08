//! The JSON log line, written without serde: the bytes tracing-subscriber's JSON format
//! (`json().flatten_event(false)`, no target) writes for an event outside any span, which is every line
//! the router writes at its default level (the per-connection span is at debug).
//!
//! tracing-subscriber serializes each event through serde_json into an `io::Write` adapter that checks
//! every piece it is handed for UTF-8 before appending it to the line: that check, serde_json's
//! escaping and the map machinery cost about 7,000 user-space instructions per connection line, a
//! seventh of a new connection's (BENCHMARKS.md, issue 18). Here each value is escaped as it is written,
//! with serde_json's escapes. An event inside an enabled span (`RUST_LOG=debug`) goes to
//! tracing-subscriber's own JSON format, which also writes the span's fields. One difference on
//! purpose: a field value whose `Debug` fails keeps what it wrote, where tracing-subscriber's format
//! panics (no value the router logs does that).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::Clock;

/// The JSON event format: [`JsonLine::format_event`] writes lines outside spans itself and hands
/// lines inside one to `stock`.
#[derive(Debug)]
pub struct JsonLine {
    /// tracing-subscriber's JSON format, configured as the line this writes.
    stock: Format<Json, Clock>,
}

impl JsonLine {
    /// The format the router logs with under `--log-format json`.
    #[must_use]
    pub fn new() -> JsonLine {
        JsonLine {
            stock: tracing_subscriber::fmt::format()
                .json()
                .flatten_event(false)
                .with_timer(Clock)
                .with_target(false),
        }
    }
}

impl Default for JsonLine {
    fn default() -> JsonLine {
        JsonLine::new()
    }
}

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The span the stock format would write, found the same way.
        let in_span = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current())
            .is_some();
        if in_span {
            return self.stock.format_event(ctx, writer, event);
        }
        writer.write_str("{\"timestamp\":\"")?;
        Clock.format_time(&mut Writer::new(&mut Escaped(&mut writer)))?;
        writer.write_str("\",\"level\":\"")?;
        // What tracing-serde writes for a level.
        writer.write_str(event.metadata().level().as_str())?;
        writer.write_str("\",\"fields\":{")?;
        let mut fields = Fields {
            out: &mut writer,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_str("}}\n")
    }
}

/// Writes an event's fields as the members of a JSON object, as tracing-serde's map visitor does (the
/// kinds of value it does not name reach `record_debug` through `Visit`'s defaults in both).
struct Fields<'a, 'w> {
    out: &'a mut Writer<'w>,
    /// No member written yet.
    first: bool,
    /// The first failure; later fields are skipped.
    result: fmt::Result,
}

impl Fields<'_, '_> {
    /// Writes `"name":` and then the value with `value`, unless an earlier write failed.
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let first = std::mem::replace(&mut self.first, false);
        self.result = (|| {
            self.out.write_str(if first { "\"" } else { ",\"" })?;
            Escaped(&mut *self.out).write_str(field.name())?;
            self.out.write_str("\":")?;
            value(self.out)
        })();
    }
}

impl Visit for Fields<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |out| {
            out.write_char('"')?;
            // The line is a `String`, so only the value's own `Debug` can fail: what it wrote stays,
            // and the line stays JSON (tracing-subscriber's format panics there instead).
            let _ = write!(Escaped(&mut *out), "{value:?}");
            out.write_char('"')
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |out| write_string(out, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |out| {
            out.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // Rare here, and serde_json's float text (and `null` for what JSON cannot hold) is its own.
        self.member(field, |out| {
            out.write_str(&serde_json::to_string(&value).map_err(|_| fmt::Error)?)
        });
    }
}

/// `s` as a JSON string, quotes included.
fn write_string(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaped(&mut *out).write_str(s)?;
    out.write_char('"')
}

/// Escapes what is written through it as serde_json escapes a string's contents: `"` and `\`, and the
/// control characters below U+0020 (`\b`, `\t`, `\n`, `\f`, `\r`, the rest as `\u00xx`); everything
/// else, DEL and all of Unicode included, as it is.
struct Escaped<W>(W);

impl<W: fmt::Write> fmt::Write for Escaped<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let bytes = s.as_bytes();
        let mut start = 0;
        // A plain test per byte finds the few that need escaping; the text between them goes out whole.
        while let Some(found) = bytes[start..]
            .iter()
            .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        {
            let at = start + found;
            // `at` is at an ASCII byte, so both slices end on character boundaries.
            self.0.write_str(&s[start..at])?;
            let b = bytes[at];
            match b {
                b'"' => self.0.write_str("\\\"")?,
                b'\\' => self.0.write_str("\\\\")?,
                0x08 => self.0.write_str("\\b")?,
                b'\t' => self.0.write_str("\\t")?,
                b'\n' => self.0.write_str("\\n")?,
                0x0c => self.0.write_str("\\f")?,
                b'\r' => self.0.write_str("\\r")?,
                _ => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    let code = [
                        b'\\',
                        b'u',
                        b'0',
                        b'0',
                        HEX[usize::from(b >> 4)],
                        HEX[usize::from(b & 0xf)],
                    ];
                    self.0.write_str(super::as_str(&code))?;
                }
            }
            start = at + 1;
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character below U+0080, and some beyond, escaped as serde_json escapes them.
    #[test]
    fn escapes_as_serde_json_does() {
        let mut samples: Vec<String> = (0u32..0x80)
            .map(|c| char::from_u32(c).unwrap().to_string())
            .collect();
        samples.extend(
            [
                "é",
                "\u{2028}",
                "\u{fffd}",
                "𝄞",
                "a\"b\\c\nd\u{1}e\u{7f}f",
                "",
                "plain",
            ]
            .map(str::to_owned),
        );
        for s in samples {
            let mut ours = String::new();
            write_string(&mut ours, &s).unwrap();
            assert_eq!(ours, serde_json::to_string(&s).unwrap(), "{s:?}");
        }
    }

    /// A sink for log lines that a test reads back.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The same events through tracing-subscriber's JSON format and through [`JsonLine`], each
    /// configured as `init` configures them; returns both outputs, each line without its timestamp
    /// (the two runs read the clock at different times).
    fn both(events: impl Fn()) -> (String, String) {
        let run = |ours: bool| {
            let lines = Lines::default();
            let sink = lines.clone();
            let builder = tracing_subscriber::fmt()
                .with_env_filter("trace")
                .with_writer(move || sink.clone())
                .with_timer(Clock)
                .with_target(false)
                .json();
            if ours {
                tracing::subscriber::with_default(
                    builder.event_format(JsonLine::new()).finish(),
                    &events,
                );
            } else {
                tracing::subscriber::with_default(builder.flatten_event(false).finish(), &events);
            }
            let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| {
                    let rest = l.strip_prefix("{\"timestamp\":\"").expect(l);
                    let (stamp, rest) = rest.split_once('"').expect(l);
                    assert_eq!(stamp.len(), 27, "{l}");
                    format!("{rest}\n")
                })
                .collect::<String>()
        };
        (run(false), run(true))
    }

    /// The connection line and the router's other events, byte for byte as tracing-subscriber writes
    /// them, with every kind of value a field can have.
    #[test]
    fn lines_match_tracing_subscribers_json() {
        use crate::logging::{Addr, MaybeAddr};
        let client: std::net::SocketAddr = "[2001:db8::1]:40000".parse().unwrap();
        let (stock, ours) = both(|| {
            tracing::info!(
                client = %Addr(client),
                listener = "https",
                name = %"api.example.com",
                decision = "allowed",
                upstream = %MaybeAddr(Some("192.0.2.7:443".parse().unwrap())),
                bytes_up = 517u64,
                bytes_down = 12_345u64,
                duration_ms = 3u64,
                "{}",
                "connection"
            );
            tracing::info!(upstream = %MaybeAddr(None), name = %"a\"b\\c\u{1}\u{7f}é\n", "x");
            tracing::warn!(error = %"refused: \"evil\"", negative = -5i64, flag = true, off = false, "upstream failed");
            tracing::error!(big = u128::MAX, small = i128::MIN, "wide numbers");
            tracing::debug!(
                half = 1.5f64,
                nan = f64::NAN,
                inf = f64::INFINITY,
                tiny = 1e-300f64,
                "floats"
            );
            tracing::trace!(dbg = ?("tuple", 1), text = "plain", "trace");
            let err = std::io::Error::other("boom \"quoted\"");
            tracing::info!(
                error = &err as &(dyn std::error::Error + 'static),
                "an error value"
            );
            tracing::info!("message only, with a \"quote\"");
            tracing::info!(empty = "", "");
        });
        assert_eq!(ours, stock);
        assert_eq!(stock.lines().count(), 9);
    }

    /// Inside an enabled span the line also names the span: tracing-subscriber's format writes it.
    #[test]
    fn lines_in_a_span_match_too() {
        let (stock, ours) = both(|| {
            let span = tracing::debug_span!("conn", client = %"192.0.2.1:5", listener = "http");
            let _in = span.enter();
            tracing::info!(name = %"x.example", "connection");
            let inner = tracing::info_span!("inner", n = 2u64);
            let _inner = inner.enter();
            tracing::warn!("deeper");
        });
        assert_eq!(ours, stock);
        assert!(stock.contains("\"spans\":["), "{stock}");
    }

    /// A value whose `Debug` fails keeps what it wrote, and the line stays JSON with the other fields.
    #[test]
    fn a_failing_debug_value_leaves_a_json_line() {
        struct Fails;
        impl fmt::Debug for Fails {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("part\"ial")?;
                Err(fmt::Error)
            }
        }
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .json()
            .event_format(JsonLine::new())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(v = ?Fails, after = 1u64, "failing debug");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).expect(&text);
        assert_eq!(line["fields"]["v"], "part\"ial");
        assert_eq!(line["fields"]["after"], 1);
        assert_eq!(line["fields"]["message"], "failing debug");
    }

    /// The escaping holds when the text arrives in pieces, as `Debug` output does.
    #[test]
    fn escapes_text_written_in_pieces() {
        let mut ours = String::new();
        let mut esc = Escaped(&mut ours);
        for piece in ["a\"", "", "\u{1f}", "\\", "é\n"] {
            esc.write_str(piece).unwrap();
        }
        assert_eq!(
            format!("\"{ours}\""),
            serde_json::to_string("a\"\u{1f}\\é\n").unwrap()
        );
    }
}
