//! The operator documentation as tests read it: README.md and every `docs/*.md`, their code
//! blocks, and the `console` blocks whose printed output is compared with the real binary's.
//!
//! A `console` block is a transcript: each `$ ` line is a command, the lines after it (up to the
//! next `$ `) what it prints (standard output, then standard error). `$ echo $?` prints the
//! previous command's exit code, `$ export COUNTERD_X=v` sets a variable for the commands after
//! it. The fence's info string names the block: ```` ```console id=status-healthy ````, so that
//! the test that builds the situation it shows can find it (`tests/readme_commands.rs` for the
//! reference pages, `tests/operator_sequences.rs` for the worked sequences).
//!
//! Output is compared after [`normalise`] on both sides: times, tokens and ids, durations and
//! ages, URIs and runs of spaces are replaced by placeholders, so a block shows real values
//! (from the run that captured it) and stays true on a later run. Running a test with
//! `COUNTERD_TEST_BLESS=1` rewrites the blocks it checks with what the binary printed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and the pages under docs/, as paths relative to the root.
pub fn pages() -> Vec<String> {
    let mut out = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/{n}"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    out.extend(docs);
    out
}

pub fn read(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

/// A fenced code block: its language (the info string's first word), the rest of the info
/// string, its text, and the byte range of that text in the page.
pub struct Block {
    pub lang: String,
    pub info: String,
    pub text: String,
    pub range: std::ops::Range<usize>,
}

impl Block {
    /// The `id=...` of the info string.
    pub fn id(&self) -> Option<&str> {
        self.info
            .split_whitespace()
            .find_map(|w| w.strip_prefix("id="))
    }
}

/// A page's fenced code blocks, inline code spans and headings.
pub struct Page {
    pub blocks: Vec<Block>,
    pub spans: Vec<String>,
    pub headings: Vec<String>,
}

pub fn parse(md: &str) -> Page {
    let mut page = Page {
        blocks: Vec::new(),
        spans: Vec::new(),
        headings: Vec::new(),
    };
    let mut block: Option<Block> = None;
    let mut heading: Option<String> = None;
    for (event, range) in Parser::new(md).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(kind)) => {
                let info = match kind {
                    CodeBlockKind::Fenced(l) => l.to_string(),
                    CodeBlockKind::Indented => String::new(),
                };
                // The text: after the opening fence's line, before the closing fence's line.
                let start = md[range.clone()]
                    .find('\n')
                    .map_or(range.end, |i| range.start + i + 1);
                let body = &md[start..range.end];
                let end = body.trim_end().rfind('\n').map_or(start, |i| start + i + 1);
                block = Some(Block {
                    lang: info.split_whitespace().next().unwrap_or("").to_string(),
                    info,
                    text: String::new(),
                    range: start..end.max(start),
                });
            }
            Event::End(TagEnd::CodeBlock) => page.blocks.extend(block.take()),
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => page.headings.extend(heading.take()),
            Event::Text(t) => {
                if let Some(b) = block.as_mut() {
                    b.text.push_str(&t);
                } else if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Code(c) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&c);
                }
                page.spans.push(c.to_string());
            }
            _ => {}
        }
    }
    page
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation dropped.
pub fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// One command of a transcript and what the page says it prints.
#[derive(Clone, Debug)]
pub struct Step {
    pub command: String,
    pub printed: String,
}

/// The steps of a `console` block.
pub fn steps(text: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for line in text.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            out.push(Step {
                command: command.trim().to_string(),
                printed: String::new(),
            });
        } else if let Some(step) = out.last_mut() {
            step.printed.push_str(line);
            step.printed.push('\n');
        }
    }
    out
}

/// Every `console` block with an id, by page.
pub fn console_blocks() -> Vec<(String, Block)> {
    let mut out = Vec::new();
    for page in pages() {
        for block in parse(&read(&page)).blocks {
            if block.lang == "console" {
                out.push((page.clone(), block));
            }
        }
    }
    out
}

/// The `console` block `id` (exactly one in all pages).
pub fn console_block(id: &str) -> (String, Block) {
    let mut found: Vec<(String, Block)> = console_blocks()
        .into_iter()
        .filter(|(_, b)| b.id() == Some(id))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "console block id={id}: {} found",
        found.len()
    );
    found.pop().unwrap()
}

/// Text that varies from run to run, replaced by a placeholder; then runs of blanks as one
/// space, blank ends of lines and trailing blank lines dropped.
pub fn normalise(text: &str) -> String {
    let mut out = String::new();
    for line in text.trim_end().lines() {
        let line = replace_words(line);
        let collapsed: Vec<&str> = line.split_whitespace().collect();
        out.push_str(&collapsed.join(" "));
        out.push('\n');
    }
    out
}

/// Word-level replacements: a URI, an RFC 3339 time, a hex run of 16 digits or more (tokens,
/// ObjectIds), a test database name, a duration or age (`12s`, `3 s`, `250ms`, `1h 2m`).
fn replace_words(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..].iter().collect();
        let boundary = i == 0 || !chars[i - 1].is_alphanumeric();
        if boundary {
            if let Some((len, placeholder)) = variable_at(&rest) {
                out.push_str(placeholder);
                i += rest[..len].chars().count();
                continue;
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The length (in bytes of `s`) and placeholder of a varying value at the start of `s`.
fn variable_at(s: &str) -> Option<(usize, &'static str)> {
    if s.starts_with("mongodb://") || s.starts_with("mongodb+srv://") {
        let len = s
            .find(|c: char| c.is_whitespace() || c == ')' || c == '"' || c == '`')
            .unwrap_or(s.len());
        return Some((len, "<uri>"));
    }
    if let Some(len) = rfc3339_len(s) {
        return Some((len, "<time>"));
    }
    // A process id (`server process 3460`), a Unix time in seconds (`base watermark 1796539680`).
    if let Some(rest) = s.strip_prefix("process ") {
        let sign = usize::from(rest.starts_with('-'));
        let pid = sign
            + rest[sign..]
                .chars()
                .take_while(char::is_ascii_digit)
                .count();
        if pid > sign {
            // `on <host>` after it: the machine the server runs on.
            let host = rest[pid..]
                .strip_prefix(" on ")
                .map(|h| {
                    4 + h
                        .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '.'))
                        .unwrap_or(h.len())
                })
                .unwrap_or(0);
            return Some((8 + pid + host, "process <pid> on <host>"));
        }
    }
    let digits = s.chars().take_while(char::is_ascii_digit).count();
    if digits == 10 && !s[10..].starts_with(|c: char| c.is_alphanumeric()) {
        return Some((10, "<epoch>"));
    }
    let hex = s.chars().take_while(|c| c.is_ascii_hexdigit()).count();
    if hex >= 16 && !s[hex..].starts_with(|c: char| c.is_alphanumeric()) {
        return Some((hex, "<hex>"));
    }
    // A test database: t<pid>_<n>_<name>.
    if s.starts_with('t') && s.chars().nth(1).is_some_and(|c| c.is_ascii_digit()) {
        let len = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        if s[..len].matches('_').count() >= 2 {
            return Some((len, "app"));
        }
    }
    // A signed duration (`skew -2 ms`) is a duration.
    let sign = usize::from(s.starts_with('-'));
    duration_len(&s[sign..]).map(|len| (sign + len, "<dur>"))
}

/// `2026-12-06T06:41:07Z`, `2026-12-06T06:41:07.123Z`, `...+00:00`.
fn rfc3339_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let shape = digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(b.get(10), Some(b'T' | b' '))
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19);
    if !shape {
        return None;
    }
    let mut len = 19;
    if b.get(len) == Some(&b'.') {
        len += 1;
        while b.get(len).is_some_and(u8::is_ascii_digit) {
            len += 1;
        }
    }
    if b.get(len) == Some(&b'Z') {
        len += 1;
    } else if matches!(b.get(len), Some(b'+' | b'-')) && digits(len + 1..len + 3) {
        len += 6.min(b.len() - len);
    }
    Some(len)
}

/// A duration: one or more `<number><unit>` groups (`1h 2m 3s`, `12 s`, `0.4s`, `250ms`), the
/// unit one of ms, µs, s, m, min, h, d, followed by no letter.
fn duration_len(s: &str) -> Option<usize> {
    if !s.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let number = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let after = &s[number..];
    let space = usize::from(after.starts_with(' '));
    let unit_text = &after[space..];
    let unit = ["ms", "µs", "min", "s", "m", "h", "d"]
        .into_iter()
        .find(|u| {
            unit_text.starts_with(u)
                && !unit_text[u.len()..].starts_with(|c: char| c.is_alphanumeric())
        })?;
    let len = number + space + unit.len();
    // `1h 2m`: the next group belongs to the same duration.
    match s[len..].strip_prefix(' ').and_then(duration_len) {
        Some(more) => Some(len + 1 + more),
        None => Some(len),
    }
}

/// Words of a command line, with "double" and 'single' quotes.
pub fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                any = false;
            }
            (None, c) => current.push(c),
        }
    }
    if any || !current.is_empty() {
        out.push(current);
    }
    out
}

/// Where a transcript runs: the environment of every `counterd` in it.
pub struct Session {
    pub env: Vec<(String, String)>,
    /// Replacements in a command before it runs (a page's literal value -> this run's value).
    pub vars: Vec<(String, String)>,
    /// Replacements in what a blessed page shows (this run's value -> the page's): the test
    /// database's name as `app`, the test server's port as 27017.
    pub shown: Vec<(String, String)>,
    last_code: i32,
}

impl Session {
    pub fn new(uri: &str, database: &str) -> Session {
        Session {
            env: vec![
                ("COUNTERD_MONGODB_URI".into(), uri.into()),
                ("COUNTERD_DATABASE".into(), database.into()),
                // The shipped manifests' budget: the same line whatever this machine's limit.
                ("COUNTERD_MEMORY_BUDGET".into(), "16777216".into()),
            ],
            vars: Vec::new(),
            shown: shown_as(uri, database),
            last_code: 0,
        }
    }

    pub fn set(&mut self, name: &str, value: &str) {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.into(), value.into()));
    }

    /// Runs one command of a transcript: what it printed (stdout, then stderr).
    pub fn run(&mut self, command: &str) -> String {
        let mut command = command.to_string();
        for (from, to) in &self.vars {
            command = command.replace(from.as_str(), to);
        }
        let w = words(&command);
        match w[0].as_str() {
            "echo" if w.get(1).map(String::as_str) == Some("$?") => {
                format!("{}\n", self.last_code)
            }
            "export" => {
                let (k, v) = w[1].split_once('=').expect("export NAME=VALUE");
                self.set(k, v);
                String::new()
            }
            "counterd" => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_counterd"));
                for (k, _) in std::env::vars() {
                    if k.starts_with("COUNTERD_") {
                        c.env_remove(k);
                    }
                }
                let out = c
                    .args(&w[1..])
                    .envs(self.env.iter().cloned())
                    .current_dir(root())
                    .output()
                    .expect("run counterd");
                self.last_code = out.status.code().unwrap_or(-1);
                let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stderr));
                text
            }
            other => {
                panic!("`{command}`: a transcript runs counterd, echo $? and export, not {other}")
            }
        }
    }

    /// Runs every step of the `console` block `id` and compares what each printed with the
    /// page (normalised); with COUNTERD_TEST_BLESS=1 the page takes the real output instead.
    pub fn check_block(&mut self, id: &str) {
        let (page, block) = console_block(id);
        let mut actual = String::new();
        let mut differences = Vec::new();
        for step in steps(&block.text) {
            let printed = self.run(&step.command);
            actual.push_str(&format!("$ {}\n", step.command));
            let mut shown = printed.trim_end().to_string();
            for (from, to) in &self.shown {
                shown = shown.replace(from.as_str(), to);
            }
            actual.push_str(&shown);
            if !printed.trim_end().is_empty() {
                actual.push('\n');
            }
            let (want, got) = (normalise(&step.printed), normalise(&printed));
            if want != got {
                differences.push(format!(
                    "{page} block id={id}: `{}` printed (normalised):\n{got}\nthe page shows (normalised):\n{want}",
                    step.command
                ));
            }
        }
        if differences.is_empty() {
            return;
        }
        if std::env::var("COUNTERD_TEST_BLESS").as_deref() == Ok("1") {
            bless(&page, id, &actual);
            eprintln!("blessed {page} id={id}");
            return;
        }
        panic!("{}", differences.join("\n\n"));
    }
}

/// The test database's name as `app`, and the test server's `host:port` as `host:27017`.
fn shown_as(uri: &str, database: &str) -> Vec<(String, String)> {
    let mut out = vec![(database.to_string(), "app".to_string())];
    let host = uri
        .trim_start_matches("mongodb://")
        .split(['/', '?', ','])
        .next()
        .unwrap_or("");
    if let Some((name, _port)) = host.rsplit_once(':') {
        out.push((host.to_string(), format!("{name}:27017")));
    }
    out
}

static BLESS: Mutex<()> = Mutex::new(());

/// Rewrites the text of block `id` of `page` (the page is re-read under a lock: several tests
/// may bless blocks of one page).
fn bless(page: &str, id: &str, text: &str) {
    let _guard = BLESS.lock().unwrap_or_else(|e| e.into_inner());
    let md = read(page);
    let block = parse(&md)
        .blocks
        .into_iter()
        .find(|b| b.lang == "console" && b.id() == Some(id))
        .expect("the block");
    let mut new = md[..block.range.start].to_string();
    new.push_str(text);
    new.push_str(&md[block.range.end..]);
    std::fs::write(Path::new(&root()).join(page), new).unwrap();
}

/// The transcripts of the worked sequences, checked by `tests/operator_sequences.rs`.
pub const SEQUENCE_BLOCKS: &[&str] = &[
    "replay-verify-damage",
    "replay-dry-run",
    "replay-force",
    "replay-verify-clean",
    "backlog-oldest",
    "backlog-by-version",
    "backlog-json",
    "backlog-drain",
    "adopt-doctor",
    "adopt-snapshot-done",
    "adopt-verify",
    "adopt-compare",
    "parked-status",
    "parked-replay",
    "parked-resumed",
    "sums-get",
];

/// Checks of the helpers above (called from a test of each binary that uses them).
pub fn self_check() {
    assert_eq!(
        normalise("checkpoint 2026-12-06T06:41:07.123Z  token 8265A1B2C3D4E5F60718293A4B5C6D7E\n"),
        "checkpoint <time> token <hex>\n"
    );
    assert_eq!(
        normalise("lag 12 s, oldest 3s ago, 1h 2m left"),
        "lag <dur>, oldest <dur> ago, <dur> left\n"
    );
    assert_eq!(
        normalise("3 posts, 250ms, 16 MiB"),
        "3 posts, <dur>, 16 MiB\n"
    );
    assert_eq!(
        normalise("database t123_4_clisome here"),
        "database app here\n"
    );
    assert_eq!(
        normalise("server process 3460 on vm, watermark 1796539680"),
        "server process <pid> on <host>, watermark <epoch>\n"
    );
    assert_eq!(
        normalise("id 0000feedface, server process -1 on vm7 started"),
        "id 0000feedface, server process <pid> on <host> started\n"
    );
    assert_eq!(normalise("mongodb://a:***@h:1/?x=y (ok)"), "<uri> (ok)\n");
    assert_eq!(
        normalise("post-12 counterd_comment_state 0.5"),
        "post-12 counterd_comment_state 0.5\n"
    );
    let s = steps("$ counterd a\nout 1\n\n$ echo $?\n0\n");
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].printed, "out 1\n\n");
    assert_eq!(normalise(&s[0].printed), "out 1\n");
}
