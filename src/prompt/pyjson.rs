//! The `tojson` filter as Hugging Face defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
//! with Python's separators (`", "`, `": "`), float repr and escapes, and no HTML escaping
//! (Jinja2's own `tojson` escapes `<`, `>`, `&`, `'`; HF replaces it).
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of Python's `json.dumps` that HF's `tojson` exposes.
struct DumpOptions {
    ensure_ascii: bool,
    /// `None` = one line; `Some(unit)` = newlines, each level indented by `unit`.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// The `tojson` filter; options by keyword only (`x | tojson(indent=2)`).
pub fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            _ => return Err(invalid("tojson: indent must be an int, a string or none")),
        },
    };
    // Python's default separators depend on whether an indent is given.
    let (mut item_sep, mut key_sep) = match indent {
        Some(_) => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    if let Some(seps) = separators.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] => match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => {
                    item_sep = a.to_string();
                    key_sep = b.to_string();
                }
                _ => return Err(invalid("tojson: separators must be two strings")),
            },
            _ => return Err(invalid("tojson: separators must be a pair")),
        }
    }
    let opts = DumpOptions {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    dump(value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}

fn newline(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(unit) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(unit);
        }
    }
}

fn dump(value: &Value, opts: &DumpOptions, level: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)),
        ValueKind::String => escape_into(value.as_str().unwrap_or_default(), opts, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(opts, level + 1, out);
                dump(item, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(opts, level + 1, out);
                escape_into(key, opts, out);
                out.push_str(&opts.key_sep);
                dump(item, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push('}');
        }
        kind => {
            return Err(invalid(format!(
                "tojson: object of type {kind} is not JSON serializable"
            )))
        }
    }
    Ok(())
}

/// Python converts non-string dict keys with these rules before writing them.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::Number => Ok(number(key)),
        kind => Err(invalid(format!(
            "tojson: keys must be str, int, float, bool or None, not {kind}"
        ))),
    }
}

fn number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => "NaN".to_string(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string(),
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional when the decimal
/// exponent is in -4..16, else `d.ddde+XX`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{:e}", f);
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = (exp + 1) as usize;
            if digits.len() <= int_len {
                let zeros = "0".repeat(int_len - digits.len());
                format!("{sign}{digits}{zeros}.0")
            } else {
                format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        }
    } else {
        let mant = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

/// A JSON string literal the way Python's encoder writes it.
fn escape_into(s: &str, opts: &DumpOptions, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => push_u(c as u32, out),
            c if opts.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    push_u(u32::from(*unit), out);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_u(code: u32, out: &mut String) {
    out.push_str(&format!("\\u{code:04x}"));
}
