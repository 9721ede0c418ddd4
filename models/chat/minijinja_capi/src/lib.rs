//! C ABI over minijinja for rendering the Jinja chat templates that GGUF files carry
//! (`tokenizer.chat_template`).
//!
//! The environment mirrors how Hugging Face transformers' `apply_chat_template` sets up jinja2,
//! so a template renders to the same bytes here as it does there:
//!   * `trim_blocks` and `lstrip_blocks` on, `keep_trailing_newline` off (jinja2's default);
//!   * lenient undefined values (an undefined attribute is falsy and prints as "");
//!   * `raise_exception(msg)` fails the render with `msg`;
//!   * `tojson` is Python's `json.dumps(x, ensure_ascii=False)` (separators ", " and ": ",
//!     optional `indent` and `sort_keys`), not minijinja's HTML-safe compact JSON;
//!   * `strftime_now(fmt)` formats the local time with the C library's strftime;
//!   * Python string/dict/list methods (`.strip()`, `.split()`, `.items()`, ...) via
//!     minijinja-contrib's pycompat callback;
//!   * `{{ x }}` prints None/True/False and lists/dicts the way Python's str() does;
//!   * a render is bounded by RENDER_FUEL (jinja2 has no such bound; no real template nears it);
//!   * a template cannot make the process allocate without bound: the rendered text, and every
//!     string our filters and Python methods build, is capped (`output_limit`), and width-like
//!     arguments (`tojson` indent, `indent` width, `str.format` widths) are capped at MAX_WIDTH.
//!     Past a cap the render fails with an error naming it; a failed allocation would abort.
//!     The engine's own text of a list or map (`x ~ ''`, `string`, `pprint`, `format`, any
//!     filter taking a string) is capped the same way by our patch to minijinja
//!     (`patches/minijinja-3.1.0.patch`, applied by the CMake build), which also makes what
//!     copies or compares every item (`join`, `sum`, `sort`, `min`/`max`, `unique`, `in`) pay
//!     fuel for the bytes: without it a list holding many references to one large string
//!     (`[s] * 100000`) is cheap to build, 100 GB to print and minutes to sort.
//!     Printing past that cap panics inside the engine (`to_string` cannot fail); the render
//!     catches it and fails with the cap's error.
//!
//! Ownership: every `char*` handed out (rendered text, error messages) is allocated here and must
//! be released with `fucina_jinja_free`. No pointer passed in is retained after a call returns.
//! Panics never cross the ABI: they are caught and reported as errors.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt::Write as _;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Once;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{
    object_display_limit_exceeded, set_object_display_limit, Kwargs, Serde, Value, ValueKind,
};
use minijinja::{Environment, Error, ErrorKind, Output, State, UndefinedBehavior};

/// Name under which the template is registered; it appears in error messages.
const TEMPLATE_NAME: &str = "chat_template";

/// Bound on the work one render may do (roughly one unit per engine instruction), so a hostile
/// template shipped in a model file fails fast instead of looping for minutes. Real chat
/// templates spend on the order of hundreds of units per message, so this leaves room for tens
/// of thousands of messages while a runaway loop fails within about half a second.
const RENDER_FUEL: u64 = 10_000_000;

/// Floor of the cap on the text one render may produce (the prompt, and any one string built by
/// our filters and methods on the way). The cap is this or OUTPUT_LIMIT_PER_CONTEXT_BYTE times
/// the size of the conversation, whichever is larger: real templates add a few hundred bytes per
/// message around text they copy once or twice (`tools | tojson` with an indent), while a
/// hostile one asks for gigabytes from a few bytes of source.
const MIN_OUTPUT_LIMIT: usize = 32 << 20;
const OUTPUT_LIMIT_PER_CONTEXT_BYTE: usize = 4;

/// Cap on width-like arguments that make the engine allocate that many bytes at once:
/// `tojson(indent=N)`, `indent(N)`, `"{:N}".format(x)` (width and precision). Templates use
/// single digits.
const MAX_WIDTH: usize = 4096;

/// The bytes Python methods on lists (`.count(x)`, `.index(x)`) may compare over one render,
/// as a multiple of its output cap: the engine charges a method call the string it is called
/// on, not a list's items, so with a 1 MB `s` one `(([s] * 100000) | list).count(t)` compared
/// 100 GB (seconds of memcmp), and a loop of them ran for hours. Real templates call list
/// methods on a handful of short items.
const METHOD_BYTES_PER_OUTPUT_BYTE: usize = 32;

thread_local! {
    /// The cap of the render running on this thread (renders are synchronous, one per thread
    /// at a time); MIN_OUTPUT_LIMIT outside a render.
    static OUTPUT_LIMIT: Cell<usize> = const { Cell::new(MIN_OUTPUT_LIMIT) };
    /// What Python methods on lists may still compare in this render.
    static METHOD_BYTES_LEFT: Cell<usize> =
        const { Cell::new(MIN_OUTPUT_LIMIT * METHOD_BYTES_PER_OUTPUT_BYTE) };
}

/// Charges a Python method called on a list for the bytes it may compare: per item, 8 and up
/// to the shorter of the item and the longest string argument (what comparing them reads).
fn charge_method_bytes(method: &str, value: &Value, args: &[Value]) -> Result<(), Error> {
    if value.kind() != ValueKind::Seq {
        return Ok(());
    }
    let arg_len = args.iter().map(|a| a.as_str().map_or(0, str::len)).max().unwrap_or(0);
    let mut bytes = 0usize;
    for item in value.try_iter()? {
        let compared = item.as_str().map_or(0, str::len).min(arg_len);
        bytes = bytes.saturating_add(compared.saturating_add(8));
    }
    let left = METHOD_BYTES_LEFT.with(|c| c.get());
    if bytes > left {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "{method}(): list methods would compare more than {} bytes in this render",
                output_limit().saturating_mul(METHOD_BYTES_PER_OUTPUT_BYTE)
            ),
        ));
    }
    METHOD_BYTES_LEFT.with(|c| c.set(left - bytes));
    Ok(())
}

fn output_limit() -> usize {
    OUTPUT_LIMIT.with(|c| c.get())
}

/// Sets this thread's output cap, ours and the engine's for printing a list or map, for the
/// lifetime of the guard.
struct OutputLimitGuard {
    previous: usize,
    previous_object_limit: Option<usize>,
    previous_method_bytes: usize,
}

impl OutputLimitGuard {
    fn set(limit: usize) -> OutputLimitGuard {
        OutputLimitGuard {
            previous: OUTPUT_LIMIT.with(|c| c.replace(limit)),
            previous_object_limit: set_object_display_limit(Some(limit)),
            previous_method_bytes: METHOD_BYTES_LEFT
                .with(|c| c.replace(limit.saturating_mul(METHOD_BYTES_PER_OUTPUT_BYTE))),
        }
    }
}

impl Drop for OutputLimitGuard {
    fn drop(&mut self) {
        OUTPUT_LIMIT.with(|c| c.set(self.previous));
        set_object_display_limit(self.previous_object_limit);
        METHOD_BYTES_LEFT.with(|c| c.set(self.previous_method_bytes));
    }
}

/// Keeps the panic hook quiet for the one panic a render expects (printing a list or map past
/// the cap, see the module comment) and passes every other panic to the previous hook.
fn install_quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !object_display_limit_exceeded() {
                previous(info);
            }
        }));
    });
}

fn too_large(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "{what} exceeds the limit of {} bytes on text a chat template may produce",
            output_limit()
        ),
    )
}

fn check_width(what: &str, width: u128) -> Result<usize, Error> {
    if width > MAX_WIDTH as u128 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} {width} exceeds the limit of {MAX_WIDTH}"),
        ));
    }
    Ok(width as usize)
}

/// A String sink that refuses to grow past the output cap; `write!` into it stops early.
struct Capped<'a> {
    out: &'a mut String,
    limit: usize,
}

impl std::fmt::Write for Capped<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.out.len().saturating_add(s.len()) > self.limit {
            return Err(std::fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

/// A compiled template together with the environment it was compiled in.
pub struct FucinaJinjaTemplate {
    env: Environment<'static>,
}

fn make_environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_fuel(Some(RENDER_FUEL));
    install_quiet_panic_hook();
    env.set_unknown_method_callback(python_method);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson_filter);
    env.add_filter("indent", indent_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    Ok(env)
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// The engine's `indent(width=4, first=false, blank=false)` filter, the same algorithm, with the
/// width and the result capped before the padding is allocated.
fn indent_filter(
    value: String,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    let first = match first {
        Some(f) => f,
        None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
    };
    let blank = match blank {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let width = check_width("indent: width", width as u128)?;
    let strip_newline = |s: &str| -> usize {
        let s = s.strip_suffix('\n').unwrap_or(s);
        s.strip_suffix('\r').unwrap_or(s).len()
    };
    let input = &value[..strip_newline(&value)];
    let lines = input.bytes().filter(|&b| b == b'\n').count() + 1;
    if lines.saturating_mul(width + 1).saturating_add(input.len()) > output_limit() {
        return Err(too_large("indent: the result"));
    }
    let pad = " ".repeat(width);
    let mut out = String::with_capacity(input.len() + lines * (width + 1));
    let mut iter = input.split('\n');
    if !first {
        out.push_str(iter.next().unwrap_or_default());
        out.push('\n');
    }
    for line in iter {
        // A blank line in CRLF text is a lone "\r" after splitting on '\n'.
        if !(line.is_empty() || line == "\r") || blank {
            out.push_str(&pad);
        }
        out.push_str(line);
        out.push('\n');
    }
    out.truncate(strip_newline(&out));
    Ok(Value::from(out))
}

/// Python's str/dict/list methods (minijinja-contrib's pycompat) after refusing the calls that
/// would allocate far more than their inputs: `str.format` with a huge width or precision, and
/// `str.join` of items whose text would be huge (Python's join takes strings only).
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    charge_method_bytes(method, value, args)?;
    if let Some(s) = value.as_str() {
        match method {
            "format" => check_format_widths(s)?,
            "join" => {
                if let Some(items) = args.first() {
                    let limit = output_limit();
                    let mut total = 0usize;
                    for (i, item) in items.try_iter()?.enumerate() {
                        let kind = item.kind();
                        if matches!(kind, ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!("str.join: sequence item {i}: expected str, found {kind}"),
                            ));
                        }
                        total = total
                            .saturating_add(item.as_str().map_or(24, str::len))
                            .saturating_add(s.len());
                        if total > limit {
                            return Err(too_large("str.join: the result"));
                        }
                    }
                }
            }
            _ => {}
        }
        let arg_bytes: usize = args.iter().map(|a| a.as_str().map_or(0, str::len)).sum();
        if method == "format" && s.len().saturating_add(arg_bytes) > output_limit() {
            return Err(too_large("str.format: the result"));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Refuses a `str.format` pattern whose replacement fields ask for a width or precision above
/// MAX_WIDTH (`"{:>100000000000}"`): the engine would allocate the padding before anything can
/// charge for it. Conservative: every number after a field's ':' counts.
fn check_format_widths(pattern: &str) -> Result<(), Error> {
    let bytes = pattern.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'{') {
            i += 2;
            continue;
        }
        let end = pattern[i..].find('}').map_or(bytes.len(), |e| i + e);
        if let Some(colon) = pattern[i..end].find(':') {
            let mut width: u128 = 0;
            let mut in_digits = false;
            for &b in &bytes[i + colon + 1..end] {
                if b.is_ascii_digit() {
                    width = width.saturating_mul(10).saturating_add(u128::from(b - b'0'));
                    in_digits = true;
                } else if in_digits {
                    check_width("str.format: width or precision", width)?;
                    width = 0;
                    in_digits = false;
                }
            }
            check_width("str.format: width or precision", width)?;
        }
        i = end + 1;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// strftime_now: datetime.now().strftime(fmt). CPython hands most directives to the C library's
// strftime, so calling it directly gives the same text for the directives templates use.

#[repr(C)]
struct Tm {
    tm_sec: c_int,
    tm_min: c_int,
    tm_hour: c_int,
    tm_mday: c_int,
    tm_mon: c_int,
    tm_year: c_int,
    tm_wday: c_int,
    tm_yday: c_int,
    tm_isdst: c_int,
    tm_gmtoff: std::ffi::c_long,
    tm_zone: *const c_char,
}

extern "C" {
    fn time(t: *mut std::ffi::c_long) -> std::ffi::c_long;
    fn localtime_r(t: *const std::ffi::c_long, out: *mut Tm) -> *mut Tm;
    fn strftime(s: *mut c_char, max: usize, format: *const c_char, tm: *const Tm) -> usize;
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {what}"));
    if format.is_empty() {
        return Ok(Value::from(""));
    }
    let cfmt = CString::new(format.as_str()).map_err(|_| bad("format contains a NUL byte"))?;
    // SAFETY: plain libc calls on stack values; strftime writes at most `buf.len()` bytes.
    unsafe {
        let now = time(std::ptr::null_mut());
        let mut tm: Tm = std::mem::zeroed();
        if localtime_r(&now, &mut tm).is_null() {
            return Err(bad("localtime_r failed"));
        }
        // strftime returns 0 both for "too small" and for an empty result; grow a few times.
        let mut cap = 256usize;
        while cap <= 1 << 16 {
            let mut buf = vec![0u8; cap];
            let n = strftime(buf.as_mut_ptr() as *mut c_char, cap, cfmt.as_ptr(), &tm);
            if n > 0 {
                buf.truncate(n);
                return String::from_utf8(buf)
                    .map(Value::from)
                    .map_err(|_| bad("result is not UTF-8"));
            }
            cap *= 4;
        }
    }
    Ok(Value::from(""))
}

// ---------------------------------------------------------------------------------------------
// Python-compatible JSON (json.dumps with ensure_ascii=False) and str()/repr() of values.

/// Python's float repr: the shortest round-trip digits, fixed notation when the decimal exponent
/// is in [-4, 16), otherwise d.ddde+XX with at least two exponent digits; integral values keep
/// a ".0".
fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's {:e} gives the shortest round-trip digits as "d.ddde<exp>".
    let sci = format!("{:e}", f);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

fn number_repr(v: &Value) -> Result<String, Error> {
    if v.is_integer() {
        let i = i128::try_from(v.clone())?;
        Ok(i.to_string())
    } else {
        Ok(py_float_repr(f64::try_from(v.clone())?))
    }
}

/// Python json's string encoder with ensure_ascii=False: escapes '"', '\\' and the C0 controls
/// (\n \r \t \b \f by name, the rest as \u00XX); everything else is written as is.
fn json_string(out: &mut String, s: &str) {
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
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct JsonStyle {
    indent: Option<String>,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
    limit: usize,  // output_limit(); checked after each item
}

fn json_newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

/// Python converts non-string dict keys: numbers by repr, bools/None as JSON literals.
fn json_key(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => number_repr(k),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: nesting too deep"));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_repr(v)?),
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, depth + 1);
                write_json(out, item, style, depth + 1)?;
                if out.len() > style.limit {
                    return Err(too_large("tojson: the result"));
                }
            }
            json_newline(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for k in v.try_iter()? {
                let item = v.get_item(&k)?;
                entries.push((json_key(&k)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, depth + 1);
                json_string(out, k);
                out.push_str(&style.key_sep);
                write_json(out, item, style, depth + 1)?;
                if out.len() > style.limit {
                    return Err(too_large("tojson: the result"));
                }
            }
            json_newline(out, style, depth);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of kind {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// `x | tojson(indent=None, separators=None, sort_keys=False)` as HF defines it.
fn tojson_filter(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            check_width("tojson: indent", s.len() as u128)?;
            Some(s.to_string())
        }
        Some(v) => {
            let width = check_width("tojson: indent", i128::try_from(v)?.max(0) as u128)?;
            Some(" ".repeat(width))
        }
    };
    // Python's defaults: (", ", ": ") without indent, (",", ": ") with one.
    let (mut item_sep, mut key_sep) =
        (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string());
    if let Some(seps) = separators.filter(|s| !s.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if parts.len() != 2 {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators needs 2 items"));
        }
        item_sep = parts[0].to_string();
        key_sep = parts[1].to_string();
    }
    let style = JsonStyle {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        item_sep,
        key_sep,
        limit: output_limit(),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

/// Python's repr() of a str: single quotes unless the text has ' and no ", backslash escapes for
/// the quote, '\\', \n \r \t and \xNN for other ASCII controls.
fn py_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's str() (top level) / repr() (inside containers) of a value.
fn py_str(out: &mut String, v: &Value, nested: bool, depth: usize) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(ErrorKind::InvalidOperation, "value nesting too deep to print"));
    }
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&number_repr(v)?);
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&match py_float_repr(f).as_str() {
                    "NaN" => "nan".to_string(),
                    "Infinity" => "inf".to_string(),
                    "-Infinity" => "-inf".to_string(),
                    s => s.to_string(),
                });
            }
        }
        ValueKind::String if nested => py_str_repr(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(out, &item, true, depth + 1)?;
                if out.len() > output_limit() {
                    return Err(too_large("printing a list"));
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(out, &k, true, depth + 1)?;
                out.push_str(": ");
                py_str(out, &v.get_item(&k)?, true, depth + 1)?;
                if out.len() > output_limit() {
                    return Err(too_large("printing a dict"));
                }
            }
            out.push('}');
        }
        // Strings at top level, bytes, iterables and objects: the engine's own text.
        _ => {
            let limit = output_limit();
            if write!(Capped { out, limit }, "{v}").is_err() {
                return Err(too_large("printing a value"));
            }
        }
    }
    Ok(())
}

fn python_formatter(out: &mut Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    let io_err = |_| Error::new(ErrorKind::WriteFailure, "formatter write failed");
    match value.kind() {
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()).map_err(io_err),
        _ => {
            let mut s = String::new();
            py_str(&mut s, value, false, 0)?;
            out.write_str(&s).map_err(io_err)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// C ABI.

/// "<kind>: <detail> (line N)" plus the engine's chained causes; the line is the template line
/// the error was raised on, when the engine knows it.
fn describe_error(err: &Error) -> String {
    let mut msg = match err.detail() {
        Some(detail) if err.kind() == ErrorKind::InvalidOperation => detail.to_string(),
        Some(detail) => format!("{}: {}", err.kind(), detail),
        None => err.kind().to_string(),
    };
    if let Some(line) = err.line() {
        let _ = write!(msg, " (line {line})");
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let _ = write!(msg, "; caused by: {cause}");
        source = cause.source();
    }
    msg
}

fn to_c_string(s: String) -> *mut c_char {
    // Interior NULs cannot cross a C string boundary; replace rather than truncate silently.
    let s = if s.contains('\0') { s.replace('\0', "\u{fffd}") } else { s };
    CString::new(s).expect("NULs were replaced").into_raw()
}

fn set_out(slot: *mut *mut c_char, s: String) {
    if !slot.is_null() {
        // SAFETY: the caller passes a writable pointer slot (checked non-null above).
        unsafe { *slot = to_c_string(s) };
    }
}

/// Reads a NUL-terminated UTF-8 argument.
fn read_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string that outlives the call.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| format!("{what} is not valid UTF-8"))
}

fn guarded(err: *mut *mut c_char, f: impl FnOnce() -> Result<(), String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            set_out(err, msg);
            1
        }
        Err(_) => {
            set_out(err, "internal error: the template engine panicked".into());
            2
        }
    }
}

fn compile(source: &str) -> Result<FucinaJinjaTemplate, String> {
    let mut env = make_environment().map_err(|e| describe_error(&e))?;
    env.add_template_owned(TEMPLATE_NAME, source.to_string())
        .map_err(|e| describe_error(&e))?;
    Ok(FucinaJinjaTemplate { env })
}

/// The rendered text, refusing to grow past `limit` bytes (the engine stops at the first
/// refused write).
struct CappedSink {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl std::io::Write for CappedSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.limit {
            self.exceeded = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn render(tmpl: &FucinaJinjaTemplate, context_json: &str) -> Result<String, String> {
    let ctx: serde_json::Value = serde_json::from_str(context_json)
        .map_err(|e| format!("context is not valid JSON: {e}"))?;
    if !ctx.is_object() {
        return Err("context must be a JSON object".into());
    }
    let limit =
        MIN_OUTPUT_LIMIT.max(context_json.len().saturating_mul(OUTPUT_LIMIT_PER_CONTEXT_BYTE));
    let _guard = OutputLimitGuard::set(limit);
    let t = tmpl.env.get_template(TEMPLATE_NAME).map_err(|e| describe_error(&e))?;
    let mut sink = CappedSink { buf: Vec::new(), limit, exceeded: false };
    let result = catch_unwind(AssertUnwindSafe(|| {
        t.render_captured_to(Value::from(Serde(&ctx)), &mut sink).map(drop)
    }));
    // Checked first: a capped print may panic, fail the render or be swallowed by the caller.
    if object_display_limit_exceeded() {
        return Err(describe_error(&too_large("printing a list or map")));
    }
    let result = result.unwrap_or_else(|panic| resume_unwind(panic));
    if sink.exceeded {
        return Err(describe_error(&too_large("the rendered prompt")));
    }
    result.map_err(|e| describe_error(&e))?;
    // Every write came from a &str, so the bytes are UTF-8.
    String::from_utf8(sink.buf).map_err(|_| "the rendered prompt is not valid UTF-8".to_string())
}

/// Compiles `source`. On success stores a handle in `*out` (release with
/// `fucina_jinja_template_free`) and returns 0; otherwise stores a message in `*err` (release
/// with `fucina_jinja_free`) and returns non-zero. A compiled template may be rendered from
/// several threads at once.
#[no_mangle]
pub extern "C" fn fucina_jinja_compile(
    source: *const c_char,
    out: *mut *mut FucinaJinjaTemplate,
    err: *mut *mut c_char,
) -> c_int {
    guarded(err, || {
        let source = read_arg(source, "template")?;
        let t = compile(source)?;
        if out.is_null() {
            return Err("output slot is null".into());
        }
        // SAFETY: `out` is a writable slot (checked non-null).
        unsafe { *out = Box::into_raw(Box::new(t)) };
        Ok(())
    })
}

/// Renders a compiled template with the variables of the JSON object `context_json`.
#[no_mangle]
pub extern "C" fn fucina_jinja_render_compiled(
    tmpl: *const FucinaJinjaTemplate,
    context_json: *const c_char,
    out: *mut *mut c_char,
    err: *mut *mut c_char,
) -> c_int {
    guarded(err, || {
        if tmpl.is_null() {
            return Err("template handle is null".into());
        }
        // SAFETY: a live handle from fucina_jinja_compile; rendering only borrows it.
        let tmpl = unsafe { &*tmpl };
        let text = render(tmpl, read_arg(context_json, "context")?)?;
        set_out(out, text);
        Ok(())
    })
}

/// One-shot compile + render; same conventions as above.
#[no_mangle]
pub extern "C" fn fucina_jinja_render(
    template: *const c_char,
    context_json: *const c_char,
    out: *mut *mut c_char,
    err: *mut *mut c_char,
) -> c_int {
    guarded(err, || {
        let t = compile(read_arg(template, "template")?)?;
        let text = render(&t, read_arg(context_json, "context")?)?;
        set_out(out, text);
        Ok(())
    })
}

/// Releases a string returned by this library (null is ignored).
#[no_mangle]
pub extern "C" fn fucina_jinja_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw in this library.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Releases a compiled template (null is ignored).
#[no_mangle]
pub extern "C" fn fucina_jinja_template_free(tmpl: *mut FucinaJinjaTemplate) {
    if !tmpl.is_null() {
        // SAFETY: `tmpl` came from Box::into_raw in fucina_jinja_compile.
        drop(unsafe { Box::from_raw(tmpl) });
    }
}

#[cfg(test)]
mod tests {
    use super::{compile, py_float_repr, render};

    const CONTEXT: &str = r#"{"messages": [{"role": "user", "content": "hi"}], "big": 1}"#;

    fn render_source(source: &str) -> Result<String, String> {
        render(&compile(source)?, CONTEXT)
    }

    // Each template asks the engine for gigabytes from a few bytes of source; the render must
    // fail with an error instead of allocating (a failed allocation aborts the process).
    #[test]
    fn hostile_sizes_fail_with_an_error() {
        let big = "{% set s = 'x' * 1000000 %}";
        for (source, want) in [
            (
                "{{ messages|tojson(indent=100000000000) }}",
                "tojson: indent 100000000000 exceeds the limit of 4096",
            ),
            (
                "{{ messages|tojson(indent='x' * 5000) }}",
                "tojson: indent 5000 exceeds the limit of 4096",
            ),
            (
                "{{ 'a\nb'|indent(100000000000) }}",
                "indent: width 100000000000 exceeds the limit of 4096",
            ),
            (
                "{{ 'a\nb'|indent(width=100000000000) }}",
                "indent: width 100000000000 exceeds the limit of 4096",
            ),
            (
                "{{ '{:>100000000000}'.format('x') }}",
                "str.format: width or precision 100000000000 exceeds",
            ),
            (
                "{{ '{0:.99999999999f}'.format(1.5) }}",
                "str.format: width or precision 99999999999 exceeds",
            ),
            (
                "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                "the rendered prompt exceeds the limit of 33554432 bytes",
            ),
            ("$S{{ [s] * 100000 }}", "exceeds the limit of 33554432 bytes"),
            ("$S{{ ([s] * 100000)|tojson }}", "tojson: the result exceeds the limit"),
            ("$S{{ ([s] * 100000)|tojson(indent=2) }}", "tojson: the result exceeds the limit"),
            ("$S{{ {'k': [s] * 100000} }}", "exceeds the limit"),
            ("$S{{ ''.join([s] * 100000) }}", "str.join: the result exceeds the limit"),
            ("$S{{ ''.join([[s] * 100000]) }}", "str.join: sequence item 0: expected str"),
            (
                "{{ ('\n' * 1000000)|indent(100, blank=true) }}",
                "indent: the result exceeds the limit",
            ),
            (
                concat!(
                    "{% set ns = namespace(s='x') %}{% for i in range(40) %}",
                    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
                ),
                "",
            ),
            ("$S{{ s.replace('x', s) }}", ""),
            ("$S{{ ([s] * 100000)|map('upper')|join }}", ""),
            ("$S{% for x in [s] * 100000 %}{{ x }}{% endfor %}", ""),
            (
                concat!(
                    "$S{% set y %}{% for x in [s] * 100000 %}{{ x }}{% endfor %}{% endset %}",
                    "{{ y|length }}"
                ),
                "",
            ),
            ("{{ 'ab' * 100000000000 }}", ""),
            ("{{ range(100000000000)|list|length }}", ""),
            ("{{ messages|batch(100000000000, 'x')|list }}", ""),
            ("{{ messages|slice(100000000000)|list }}", ""),
            ("{{ '%100000000000s'|format('x') }}", ""),
        ] {
            let source = &source.replace("$S", big);
            let err = render_source(source).expect_err(source);
            assert!(err.contains(want), "{source}: {err}");
        }
    }

    #[test]
    fn ordinary_indent_and_format_still_work() {
        assert_eq!(render_source("{{ 'a\nb\n\nc\n'|indent(2) }}").unwrap(), "a\n  b\n\n  c");
        assert_eq!(render_source("{{ 'a\nb'|indent(2, true) }}").unwrap(), "  a\n  b");
        assert_eq!(
            render_source("{{ 'a\n\nb'|indent(width=1, blank=true) }}").unwrap(),
            "a\n \n b"
        );
        assert_eq!(render_source("{{ '{:>5}|{:.2f}'.format('x', 1.5) }}").unwrap(), "    x|1.50");
        assert_eq!(render_source("{{ '-'.join(['a', 'b']) }}").unwrap(), "a-b");
        assert_eq!(
            render_source("{{ {'a': [1]}|tojson(indent=1) }}").unwrap(),
            "{\n \"a\": [\n  1\n ]\n}"
        );
    }

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }
}
