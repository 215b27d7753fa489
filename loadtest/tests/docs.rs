//! The docs say what the code does, where it can drift: the settings table of
//! `docs/operations.md` is `seckill --help` (every setting, its flag and its default), its
//! API table is the OpenAPI document's routes, its metrics table is what `/metrics` serves,
//! and every relative link (and anchor) in the README, `docs/*.md` and `lock/README.md` leads
//! somewhere. Each check is also shown to catch the mistake it is for, on a broken copy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser as _};
use serde_json::Value;
use sqlx::PgPool;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown files whose links are checked: the README, every file in `docs/`, the lock
/// crate's guide.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("lock/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("a docs/ folder")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// `markdown` without its fenced code blocks (each line of one becomes empty, so line
/// numbers stay).
fn outside_fences(markdown: &str) -> Vec<&str> {
    let mut in_fence = false;
    markdown
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                ""
            } else if in_fence {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// The cells of a table row, trimmed; `|` inside a code span is not a separator.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut in_code = false;
    for c in row.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                cells.last_mut().unwrap().push(c);
            }
            '|' if !in_code => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The body rows of the first table under the heading `## <heading>`, each as its cells.
fn table_under(markdown: &str, heading: &str) -> Vec<Vec<String>> {
    let lines = outside_fences(markdown);
    let start = lines
        .iter()
        .position(|line| line.trim() == format!("## {heading}"))
        .unwrap_or_else(|| panic!("no `## {heading}` heading"));
    lines[start + 1..]
        .iter()
        .take_while(|line| !line.starts_with("## "))
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        // The header row and the alignment row.
        .skip(2)
        .map(|line| cells(line))
        .collect()
}

/// A cell's text without its code spans' backticks.
fn plain(cell: &str) -> String {
    cell.replace('`', "")
}

/// What the settings table gets wrong about `command` (`seckill --help`): settings it lacks
/// or has too many, a flag or a default that is not the setting's.
fn settings_problems(operations: &str, command: &clap::Command) -> Vec<String> {
    let table: BTreeMap<String, Vec<String>> = table_under(operations, "Settings")
        .into_iter()
        .map(|row| (plain(&row[0]), row))
        .collect();
    let mut problems = Vec::new();
    let mut settings = BTreeSet::new();
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env() else {
            problems.push(format!(
                "--{} has no environment variable",
                arg.get_long().unwrap_or_default()
            ));
            continue;
        };
        let env = env.to_string_lossy().into_owned();
        settings.insert(env.clone());
        let Some(row) = table.get(&env) else {
            problems.push(format!("{env} is a setting, but not in the table"));
            continue;
        };
        let flag = format!("--{}", arg.get_long().unwrap_or_default());
        if row.get(1).map(|c| plain(c)) != Some(flag.clone()) {
            problems.push(format!("{env}: the flag is {flag}, the table says {row:?}"));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let allowed: Vec<String> = match defaults.as_slice() {
            [] if arg.is_required_set() => vec!["(required)".into()],
            [] => vec!["unset".into(), "empty".into()],
            [empty] if empty.is_empty() => vec!["empty".into()],
            values => vec![values.join(",")],
        };
        let shown = row.get(2).map(|c| plain(c)).unwrap_or_default();
        if !allowed.contains(&shown) {
            problems.push(format!(
                "{env}: the default is {allowed:?}, the table says {shown:?}"
            ));
        }
    }
    for name in table.keys() {
        if !settings.contains(name) {
            problems.push(format!("the table has {name}, which is not a setting"));
        }
    }
    problems
}

/// The route that serves the OpenAPI document, which the document does not list.
const DOCUMENT_ROUTE: &str = "GET /api-docs/openapi.json";

/// What the API table gets wrong about the OpenAPI `document`: routes it lacks or has too
/// many (`METHOD /path`, as the first cell of a row).
fn route_problems(operations: &str, document: &Value) -> Vec<String> {
    let documented: BTreeSet<String> = document["paths"]
        .as_object()
        .expect("paths in the document")
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item").keys();
            methods.map(move |method| format!("{} {path}", method.to_uppercase()))
        })
        .chain([DOCUMENT_ROUTE.to_owned()])
        .collect();
    let tabled: BTreeSet<String> = table_under(operations, "API")
        .iter()
        .map(|row| plain(&row[0]))
        .collect();
    let mut problems: Vec<String> = documented
        .difference(&tabled)
        .map(|route| format!("{route} is served, but not in the API table"))
        .collect();
    problems.extend(
        tabled
            .difference(&documented)
            .map(|route| format!("the API table has {route}, which the service does not serve")),
    );
    problems
}

/// What the metrics table gets wrong about `exposition` (what `/metrics` answered):
/// metrics it lacks or has too many, or a type that is not the metric's.
fn metric_problems(operations: &str, exposition: &str) -> Vec<String> {
    let served: BTreeMap<String, String> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    let tabled: BTreeMap<String, String> = table_under(operations, "Metrics")
        .into_iter()
        .map(|row| (plain(&row[0]), row.get(1).cloned().unwrap_or_default()))
        .collect();
    let mut problems = Vec::new();
    for (name, kind) in &served {
        match tabled.get(name) {
            None => problems.push(format!("{name} is served, but not in the metrics table")),
            Some(said) if !said.starts_with(kind.as_str()) => {
                problems.push(format!("{name} is a {kind}, the table says {said:?}"))
            }
            Some(_) => {}
        }
    }
    for name in tabled.keys() {
        if !served.contains_key(name) {
            problems.push(format!("the metrics table has {name}, which is not served"));
        }
    }
    problems
}

/// The anchor GitHub gives a heading: lower case, only letters, digits, `-` and `_` kept,
/// spaces as `-` (code spans and links count by their text).
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` counts as `text`.
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").and_then(|mid| {
            let close = rest[open + mid..].find(')')?;
            Some((open + mid, open + mid + close))
        }) {
            Some((mid, close)) => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..mid]);
                rest = &rest[close + 1..];
            }
            None => break,
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading of `markdown`, the second of a name with `-1`, and so on.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in outside_fences(markdown) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim());
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(if *count == 0 {
            base
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// Every link target of `markdown` (`[text](target)` and `![alt](target)`), outside fenced
/// code and code spans, with its line number.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    // A code span may run over a line break, but not past a blank line.
    let mut in_code = false;
    for (number, line) in outside_fences(markdown).into_iter().enumerate() {
        if line.trim().is_empty() {
            in_code = false;
        }
        let mut outside = String::new();
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                // Keep the columns of what is outside: a code span is blanked, not cut.
                outside.push(' ');
            } else {
                outside.push(if in_code { ' ' } else { c });
            }
        }
        let mut rest = outside.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            found.push((number + 1, target.to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// Relative links of the Markdown `files` (each a path and its text) that lead nowhere: a
/// missing file or folder, or an anchor that no heading of the target has.
fn link_problems(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, markdown) in files {
        let dir = path.parent().expect("a file in a folder");
        for (line, target) in links(markdown) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let shown = path.strip_prefix(root()).unwrap_or(path);
            let at = format!("{}:{line}: {target}", shown.display());
            let linked = if file.is_empty() {
                path.clone()
            } else {
                dir.join(file)
            };
            if !linked.exists() {
                problems.push(format!("{at}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let text = if file.is_empty() {
                markdown.clone()
            } else if linked.extension().is_some_and(|e| e == "md") {
                std::fs::read_to_string(&linked).unwrap()
            } else {
                problems.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            };
            if !anchors(&text).contains(anchor) {
                problems.push(format!("{at}: no heading has the anchor #{anchor}"));
            }
        }
    }
    problems
}

fn without_line_containing(markdown: &str, needle: &str) -> String {
    let kept: Vec<&str> = markdown.lines().filter(|l| !l.contains(needle)).collect();
    assert!(
        kept.len() < markdown.lines().count(),
        "no line has {needle:?}"
    );
    kept.join("\n")
}

/// Every setting of `seckill --help` is in the settings table of docs/operations.md with its
/// flag and its default, and every row of the table is a setting.
#[test]
fn settings_table_and_seckill_help_list_the_same_settings() {
    let operations = read("docs/operations.md");
    let command = seckill::Settings::command();

    assert_eq!(
        settings_problems(&operations, &command),
        Vec::<String>::new()
    );

    // The check catches what it is for: a setting left out, a default that drifted, a row
    // for a setting that does not exist.
    let left_out = without_line_containing(&operations, "| `LOCK_TTL_MS` |");
    assert_eq!(
        settings_problems(&left_out, &command),
        ["LOCK_TTL_MS is a setting, but not in the table"]
    );
    let drifted = operations.replace("| `--batch-max` | `256` |", "| `--batch-max` | `32` |");
    assert_eq!(settings_problems(&drifted, &command).len(), 1);
    let invented = operations.replace(
        "| `BATCH_MAX` |",
        "| `BATCH_MIN` | `--batch-min` | `1` | made up |\n| `BATCH_MAX` |",
    );
    assert_eq!(
        settings_problems(&invented, &command),
        ["the table has BATCH_MIN, which is not a setting"]
    );
}

/// Every route of the OpenAPI document and every metric of `/metrics` is in its table in the
/// docs, and every row of those tables is served.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn route_and_metric_tables_match_what_an_instance_serves(pool: PgPool) {
    // Arrange: a real instance, which serves the document and the metrics.
    let mut settings =
        seckill::Settings::try_parse_from(["seckill", "--database-url", "unused"]).unwrap();
    settings.http.bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.http.ops_bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.identity.secret = Some(loadtest::buyers::DEMO_BUYER_SECRET.into());
    settings.redis.key_prefix = testkit::unique_prefix("docs");
    if let Ok(url) = std::env::var("REDIS_URL") {
        settings.redis.url = url.into();
    }
    let _cleanup = testkit::PrefixCleanup::new(settings.redis.url(), &settings.redis.key_prefix);
    let app = seckill::Application::build_with_pool(settings, pool)
        .await
        .unwrap();
    let ops = format!("http://{}", app.operations_address());
    tokio::spawn(app.run_until_stopped());
    let operations = read("docs/operations.md");

    // Act
    let document: Value = reqwest::get(format!("{ops}/api-docs/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let metrics = reqwest::get(format!("{ops}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    // Assert
    assert_eq!(route_problems(&operations, &document), Vec::<String>::new());
    assert_eq!(metric_problems(&operations, &metrics), Vec::<String>::new());

    // The checks catch what they are for.
    let left_out = without_line_containing(&operations, "| `GET /readyz` |");
    assert_eq!(
        route_problems(&left_out, &document),
        ["GET /readyz is served, but not in the API table"]
    );
    let invented = operations.replace(
        "| `GET /healthz` |",
        "| `DELETE /api/products/{id}` | admin | | 204 |\n| `GET /healthz` |",
    );
    assert_eq!(
        route_problems(&invented, &document),
        ["the API table has DELETE /api/products/{id}, which the service does not serve"]
    );
    let left_out = without_line_containing(&operations, "| `seckill_batch_size` |");
    assert_eq!(
        metric_problems(&left_out, &metrics),
        ["seckill_batch_size is served, but not in the metrics table"]
    );
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_leads_somewhere() {
    let files: Vec<(PathBuf, String)> = markdown_files()
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect();
    assert!(files.len() >= 5, "{files:?}");

    assert_eq!(link_problems(&files), Vec::<String>::new());

    // The check catches what it is for, and leaves code alone.
    let broken = "# Broken\n\
                  [a file](docs/no-such-file.md), [a section](docs/operations.md#no-such-section),\n\
                  [here](#nowhere), [fine](#broken), [fine too](docs/operations.md#api),\n\
                  `[in code](no-such-file.md)` and\n\
                  ```\n[in a fence](no-such-file.md)\n```\n";
    let problems = link_problems(&[(root().join("README.md"), broken.to_owned())]);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].ends_with("docs/no-such-file.md: no such file"),
        "{problems:?}"
    );
    assert!(problems[1].contains("#no-such-section"));
    assert!(problems[2].contains("#nowhere"));
}

#[test]
fn headings_get_the_anchors_github_gives_them() {
    assert_eq!(
        slug("The database lock of the seeds (`PgLockTable`)"),
        "the-database-lock-of-the-seeds-pglocktable"
    );
    assert_eq!(
        slug("bench-http: one instance under wrk"),
        "bench-http-one-instance-under-wrk"
    );
    assert_eq!(slug("The [lock](lock/README.md) crate"), "the-lock-crate");
    let twice = anchors("# Notes\n## Notes\n```\n# not a heading\n```\n");
    assert_eq!(
        twice,
        BTreeSet::from(["notes".to_owned(), "notes-1".to_owned()])
    );
}
