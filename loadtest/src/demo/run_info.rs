//! When, where and how the demo (or the bench) ran: the date, the machine and the command
//! line, for the headers of tables and charts.

/// When, where and how a demo ran: the table's and the chart's header.
pub struct RunInfo {
    /// UTC, to the minute.
    pub date: String,
    /// Cores and CPU model.
    pub machine: String,
    /// The command line, as `loadtest demo ...`, passwords in URLs hidden.
    pub command: String,
}

impl RunInfo {
    /// This process, now.
    pub fn now() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            machine: machine(),
            command: command_line(&args),
        }
    }
}

/// `2 cores, Intel(R) Xeon(R) Processor`: the cores this process may use (as `nproc`
/// counts them) and the CPU model from `/proc/cpuinfo` (Linux).
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "CPU model unknown".to_owned());
    format!("{cores} cores, {model}")
}

/// `loadtest` and `args` as a shell would take them back, with any password in a URL hidden.
pub fn command_line(args: &[String]) -> String {
    let mut line = String::from("loadtest");
    for arg in args {
        let arg = if arg.contains("://") {
            seckill::redact::redacted(arg)
        } else {
            arg.clone()
        };
        line.push(' ');
        if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '"') {
            line.push_str(&format!("{arg:?}"));
        } else {
            line.push_str(&arg);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_hides_passwords_and_quotes_empty_arguments() {
        let args: Vec<String> = [
            "demo",
            "--database-url",
            "postgres://me:hunter2@db/x",
            "--per-request",
            "",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            command_line(&args),
            r#"loadtest demo --database-url postgres://***@db/x --per-request """#
        );
    }
}
