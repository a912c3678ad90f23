//! Python semantics where chat templates can tell minijinja from Jinja2.
//!
//! Templates are written against Python: `trim`/`.strip()` strip what `str.isspace()` calls
//! whitespace (which includes U+001C..U+001F, unlike Rust's `char::is_whitespace`),
//! `.split()`/`.splitlines()` split on Python's separators, `.find()` counts code points,
//! and `{{ none }}`/`{{ true }}` print `None`/`True`. minijinja-contrib's pycompat covers
//! the remaining Python methods.

use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};

/// Python's `str.isspace()` for one character: Unicode White_Space plus the four ASCII
/// information separators U+001C..U+001F.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip/lstrip/rstrip(chars)`.
pub fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    if right {
        s.trim_end_matches(strip)
    } else {
        s
    }
}

/// Python's `str.split(sep=None, maxsplit=-1)`.
pub fn py_split<'a>(s: &'a str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<&'a str>, Error> {
    match sep {
        Some("") => Err(Error::new(
            ErrorKind::InvalidOperation,
            "split: empty separator",
        )),
        Some(sep) => Ok(if maxsplit < 0 {
            s.split(sep).collect()
        } else {
            let n = usize::try_from(maxsplit)
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            s.splitn(n, sep).collect()
        }),
        None => {
            // Runs of whitespace separate; once maxsplit is reached the rest is one piece
            // with its leading (not trailing) whitespace removed.
            let mut out = Vec::new();
            let mut rest = s.trim_start_matches(is_py_space);
            while !rest.is_empty() {
                if maxsplit >= 0 && out.len() as i64 == maxsplit {
                    out.push(rest);
                    break;
                }
                match rest.find(is_py_space) {
                    Some(i) => {
                        out.push(&rest[..i]);
                        rest = rest[i..].trim_start_matches(is_py_space);
                    }
                    None => {
                        out.push(rest);
                        break;
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Python's `str.splitlines(keepends)`: `\n`, `\r`, `\r\n`, `\v`, `\f`, U+001C..U+001E,
/// U+0085, U+2028 and U+2029 end lines.
pub fn py_splitlines(s: &str, keepends: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' && matches!(chars.peek(), Some((_, '\n'))) {
            chars.next();
            end += 1;
        }
        out.push(if keepends {
            &s[start..end]
        } else {
            &s[start..i]
        });
        start = end;
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Python's `str.find`/`str.rfind` result: a code point index or -1.
fn char_index(s: &str, byte_index: Option<usize>) -> i64 {
    match byte_index {
        Some(b) => s[..b].chars().count() as i64,
        None => -1,
    }
}

/// The unknown-method callback: Python string methods with Python semantics first, then
/// minijinja-contrib's pycompat for everything else.
pub fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "strip" | "lstrip" | "rstrip" => {
                let (chars,): (Option<&str>,) = from_args(args)?;
                let left = method != "rstrip";
                let right = method != "lstrip";
                return Ok(Value::from(py_strip(s, chars, left, right)));
            }
            "split" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                let parts = py_split(s, sep, maxsplit.unwrap_or(-1))?;
                return Ok(parts.into_iter().map(Value::from).collect());
            }
            "splitlines" => {
                let (keepends,): (Option<bool>,) = from_args(args)?;
                let lines = py_splitlines(s, keepends.unwrap_or(false));
                return Ok(lines.into_iter().map(Value::from).collect());
            }
            "isspace" => {
                let () = from_args(args)?;
                return Ok(Value::from(!s.is_empty() && s.chars().all(is_py_space)));
            }
            "find" | "rfind" => {
                let (what,): (&str,) = from_args(args)?;
                let at = if method == "find" {
                    s.find(what)
                } else {
                    s.rfind(what)
                };
                return Ok(Value::from(char_index(s, at)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja2's `trim(value, chars=None)` filter, i.e. Python's `str(value).strip(chars)`.
pub fn trim_filter(value: &Value, chars: Option<&str>) -> Value {
    let text = match value.as_str() {
        Some(s) => py_strip(s, chars, true, true).to_string(),
        None => {
            let s = py_str(value);
            py_strip(&s, chars, true, true).to_string()
        }
    };
    Value::from(text)
}

/// Python's `str()` of a template value where it differs from minijinja's display:
/// `None`, `True`/`False` and floats (`1e+16`, not `10000000000000000.0`).
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => super::pyjson::float_repr(f),
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// The output formatter: what `{{ x }}` prints, Python style for `None`, booleans and
/// floats; everything else as minijinja prints it (no auto-escaping is configured).
pub fn formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => out
            .write_str(&py_str(value))
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string())),
        _ => minijinja::escape_formatter(out, state, value),
    }
}
