//! Limits a grammar is held to before llguidance sees it, and the JSON whitespace default.
//!
//! llguidance cannot cancel a compile in progress, and parts of it recurse once per rule or per
//! `$ref` link (a 5,000-rule Lark chain or a 1,000-deep `$ref` chain overflowed an 8 MB stack),
//! while others are quadratic in the number of distinct literals (150k `guided_choice`s took
//! minutes). Counting these here is linear and does not recurse, so a grammar past a limit is
//! refused at once with a message that names the limit.

use serde_json::{Map, Value};

/// The longest grammar text (a JSON schema, a regex or a Lark grammar).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;
/// Rules and terminals a Lark grammar may define (a chain of them is compiled recursively).
pub const MAX_LARK_RULES: usize = 2_000;
/// String and regex literals in a Lark grammar (each is a lexeme, and adding a lexeme scans the
/// ones before it: 10,000 compile in ~0.2 s on one core, 50,000 in ~7 s).
pub const MAX_LARK_LITERALS: usize = 10_000;
/// How deeply a JSON schema may nest (objects and arrays, one level for each `$ref` link too)
/// once its `$ref` chains are followed; cycles (recursive types) are fine. ~3.3 KB of stack a
/// level in llguidance: 2,000 fit an 8 MB stack.
pub const MAX_SCHEMA_DEPTH: usize = 2_000;
/// Schema values the `$ref` walk may visit, so that overlapping references stay cheap to check.
const REF_WALK_FUEL: usize = 10_000_000;

pub fn check_size(text: &str) -> Result<(), String> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(format!(
            "the grammar is {} bytes; at most {MAX_GRAMMAR_BYTES} are allowed",
            text.len()
        ));
    }
    Ok(())
}

/// What JSON output looks like unless a schema's top-level "x-guidance" says otherwise: one
/// space after ',' and ':' and no other whitespace. llguidance's own default allows any
/// whitespace between tokens, and a small model then fills the reply with newlines until
/// max_tokens instead of closing the object.
pub fn default_json_whitespace(schema: &mut Value) {
    if let Value::Object(obj) = schema {
        if !obj.contains_key("x-guidance") {
            let mut opts = Map::new();
            opts.insert("whitespace_flexible".into(), Value::Bool(false));
            opts.insert("item_separator".into(), Value::String(", ".into()));
            opts.insert("key_separator".into(), Value::String(": ".into()));
            obj.insert("x-guidance".into(), Value::Object(opts));
        }
    }
}

/// A JSON schema nests at most MAX_SCHEMA_DEPTH levels once its `$ref`s are followed.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    let depth = schema_depth(schema)?;
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "the JSON schema nests {depth} levels deep through its $ref chains; at most \
             {MAX_SCHEMA_DEPTH} are allowed"
        ));
    }
    Ok(())
}

/// What `node` holds, not following references: how deeply its own objects and arrays nest,
/// and the local `$ref` targets in its subschemas, each with the deepest level it occurs at
/// (not those in `$defs`/`definitions`, which count where they are referenced, nor in values
/// that are data: const, enum, default, examples).
fn walk(node: &Value, fuel: &mut usize) -> Result<(usize, Vec<(String, usize)>), String> {
    let mut refs: Vec<(String, usize)> = Vec::new();
    let mut deepest = 0;
    let mut todo = vec![(node, 0usize)];
    while let Some((v, depth)) = todo.pop() {
        if *fuel == 0 {
            return Err("the JSON schema's $ref graph is too large to check".into());
        }
        *fuel -= 1;
        match v {
            Value::Object(obj) => {
                deepest = deepest.max(depth + 1);
                for (k, child) in obj {
                    match k.as_str() {
                        "$ref" => {
                            if let Some(r) = child.as_str() {
                                if r.starts_with('#') {
                                    refs.push((r.to_string(), depth + 1));
                                }
                            }
                        }
                        "$defs" | "definitions" | "const" | "enum" | "default" | "examples" => {}
                        _ => todo.push((child, depth + 1)),
                    }
                }
            }
            Value::Array(items) => {
                deepest = deepest.max(depth + 1);
                todo.extend(items.iter().map(|item| (item, depth + 1)));
            }
            _ => {}
        }
    }
    refs.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    refs.dedup_by(|a, b| a.0 == b.0);
    Ok((deepest, refs))
}

/// The target of a local reference ("#" or "#/json/pointer"), if it exists.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let ptr = &r[1..];
    if ptr.is_empty() {
        Some(root)
    } else if ptr.starts_with('/') {
        root.pointer(ptr)
    } else {
        None // an anchor ("#name"): llguidance resolves it; not followed here
    }
}

/// How deeply the schema nests with each reference replaced by its target, each target
/// expanded once (a reference back into the chain is a cycle, a recursive type, and adds
/// nothing). llguidance's compile recurses about this deep: ~1,000 levels of `$ref` links through
/// objects overflowed an 8 MB stack. Iterative, so that the check itself does not recurse.
fn schema_depth(root: &Value) -> Result<usize, String> {
    enum State {
        Active,
        Done(usize),
    }
    struct Frame {
        key: Option<String>,
        base: usize, // levels above this target on the chain being followed
        refs: Vec<(String, usize)>,
        next: usize,
        best: usize, // this target's depth so far
    }
    let mut fuel = REF_WALK_FUEL;
    let mut memo: std::collections::HashMap<String, State> = Default::default();
    memo.insert("#".into(), State::Active); // the root, on the chain from the start
    let (own, refs) = walk(root, &mut fuel)?;
    let mut stack = vec![Frame { key: None, base: 0, refs, next: 0, best: own }];
    loop {
        let top = stack.last_mut().expect("the root frame is popped last");
        if top.next < top.refs.len() {
            let (target, at) = top.refs[top.next].clone();
            top.next += 1;
            match memo.get(&target) {
                Some(State::Done(d)) => top.best = top.best.max(at + d),
                Some(State::Active) => top.best = top.best.max(at), // a cycle
                None => {
                    let (own, refs) = match resolve(root, &target) {
                        Some(v) => walk(v, &mut fuel)?,
                        None => (0, Vec::new()),
                    };
                    let base = top.base + at;
                    memo.insert(target.clone(), State::Active);
                    // Already past the limit on this chain: no need to go on.
                    if base + own > MAX_SCHEMA_DEPTH {
                        return Ok(base + own);
                    }
                    stack.push(Frame { key: Some(target), base, refs, next: 0, best: own });
                }
            }
            continue;
        }
        let done = stack.pop().expect("not empty");
        match done.key {
            None => return Ok(done.best),
            Some(key) => {
                memo.insert(key, State::Done(done.best));
                let parent = stack.last_mut().expect("the root frame is below");
                let (_, at) = &parent.refs[parent.next - 1];
                parent.best = parent.best.max(at + done.best);
            }
        }
    }
}

/// Holds a Lark grammar to MAX_LARK_RULES definitions and MAX_LARK_LITERALS literals, checks
/// each embedded `%json` schema as check_schema does, and gives those schemas the JSON
/// whitespace default. Returns the grammar to compile.
pub fn check_lark(text: &str) -> Result<String, String> {
    let b = text.as_bytes();
    let n = b.len();
    let (mut rules, mut literals) = (0usize, 0usize);
    let mut out = String::with_capacity(n + 128);
    let mut copied = 0; // text[..copied] is in `out`
    let mut i = 0;
    let mut line_start = true;
    while i < n {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if line_start {
            line_start = false;
            while i < n && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r') {
                i += 1;
            }
            if starts_definition(&b[i..]) {
                rules += 1;
            }
            continue;
        }
        match c {
            b'"' => {
                literals += 1;
                i = skip_quoted(b, i, b'"');
            }
            b'/' if i + 1 < n && b[i + 1] == b'/' => i = skip_line(b, i),
            b'#' => i = skip_line(b, i),
            b'/' => {
                literals += 1;
                i = skip_quoted(b, i, b'/');
            }
            b'%' if b[i..].starts_with(b"%json")
                || b[i..].starts_with(b"%regex")
                || b[i..].starts_with(b"%llguidance") =>
            {
                let json = b[i..].starts_with(b"%json");
                let kw = if json { 5 } else if b[i + 1] == b'r' { 6 } else { 11 };
                let start = i + kw;
                let mut values =
                    serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
                match values.next() {
                    Some(Ok(mut value)) => {
                        let end = start + values.byte_offset();
                        if json {
                            check_schema(&value)?;
                            if value.is_object() && value.get("x-guidance").is_none() {
                                default_json_whitespace(&mut value);
                                out.push_str(&text[copied..start]);
                                out.push(' ');
                                out.push_str(&value.to_string());
                                copied = end;
                            }
                        }
                        i = end;
                    }
                    // Not JSON: llguidance reports it.
                    _ => i = start,
                }
            }
            _ => i += 1,
        }
    }
    if rules > MAX_LARK_RULES {
        return Err(format!(
            "the Lark grammar defines {rules} rules and terminals; at most {MAX_LARK_RULES} are \
             allowed"
        ));
    }
    if literals > MAX_LARK_LITERALS {
        return Err(format!(
            "the Lark grammar has {literals} string and regex literals; at most \
             {MAX_LARK_LITERALS} are allowed"
        ));
    }
    out.push_str(&text[copied..]);
    Ok(out)
}

/// A line that defines a rule or terminal: `[!?]name[{params}][.priority] :` (not `::`).
fn starts_definition(s: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() && (s[i] == b'!' || s[i] == b'?') {
        i += 1;
    }
    let name_start = i;
    while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_' || s[i] == b'-') {
        i += 1;
    }
    if i == name_start || s[name_start].is_ascii_digit() || s[name_start] == b'-' {
        return false;
    }
    if i < s.len() && s[i] == b'{' {
        while i < s.len() && s[i] != b'}' && s[i] != b'\n' {
            i += 1;
        }
        i += 1;
    }
    if i < s.len() && s[i] == b'.' {
        i += 1;
        while i < s.len() && (s[i].is_ascii_digit() || s[i] == b'-') {
            i += 1;
        }
    }
    while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
        i += 1;
    }
    i < s.len() && s[i] == b':' && !(i + 1 < s.len() && s[i + 1] == b':')
}

/// The index past a literal opened by `quote` at `i` (backslash escapes; ends at the line's end
/// if unclosed, which llguidance then reports).
fn skip_quoted(b: &[u8], mut i: usize, quote: u8) -> usize {
    i += 1;
    while i < b.len() && b[i] != quote && b[i] != b'\n' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(b.len())
}

fn skip_line(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rules_and_literals() {
        let g = "start: a | b // not \"a literal\"\n?a.2: \"x\" /y+/i\n  | \"z\"\nB: \"q\"\n";
        assert!(check_lark(g).is_ok());
        let chain: String =
            (0..=MAX_LARK_RULES).map(|i| format!("r{i}: r{} | \"x\"\n", i + 1)).collect();
        let e = check_lark(&format!("start: r0\n{chain}")).unwrap_err();
        assert!(e.contains("at most 2000"), "{e}");
    }

    #[test]
    fn depth_follows_ref_chains_and_not_cycles() {
        let mut defs = Map::new();
        for i in 0..10 {
            defs.insert(
                format!("d{i}"),
                serde_json::json!({"type": "object",
                    "properties": {"n": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
            );
        }
        defs.insert("d10".into(), serde_json::json!({"type": "string"}));
        let s = serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs});
        // Each link: the object, its properties, the property's schema.
        assert_eq!(schema_depth(&s).unwrap(), 1 + 10 * 3 + 1);
        let tree = serde_json::json!({"$ref": "#/$defs/t", "$defs": {"t": {"type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}}});
        assert_eq!(schema_depth(&tree).unwrap(), 1 + 4);
        assert_eq!(schema_depth(&serde_json::json!({"items": {"$ref": "#"}})).unwrap(), 2);
    }

    #[test]
    fn json_whitespace_default_goes_into_lark_json_blocks() {
        let g = check_lark("start: %json {\"type\": \"object\"}\n").unwrap();
        assert!(g.contains("\"whitespace_flexible\":false"), "{g}");
        let own = "start: %json {\"x-guidance\": {\"whitespace_flexible\": true}}\n";
        assert_eq!(check_lark(own).unwrap(), own);
    }
}
