//! Changing a running session's allowlist (issue 14; tests/e2e/scripts/live.sh and live_other.sh): two
//! sessions run while the suite, on the host, runs `allow` (plain, host:port, `--session` wildcard),
//! `deny`, an invalid `allow`, a wildcard-only `deny` and `blocked --follow`; the script in the sandbox
//! checks each change phase by phase. Also records how long an `allow` takes to apply.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::mode::{sh, text, Mode};
use crate::suite::{finish, Suite};
use crate::{ALLOWLIST, LAUNCHER};

/// `agent-sandbox ARGS` as the mode's user, to completion.
fn live(mode: &Mode, args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = sh(mode.command(LAUNCHER, &[]).args(args));
    (out, started.elapsed())
}

/// Waits for `done-N` in the project after writing `phase-N`.
fn phase(dir: &Path, n: u32) -> bool {
    fs::write(dir.join(format!("phase-{n}")), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if dir.join(format!("done-{n}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Seconds since the epoch, now.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The session id of the running session in `project`, from `sessions --json`.
fn session_of(mode: &Mode, project: &Path) -> Option<String> {
    let (out, _) = live(mode, &["sessions", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    list.as_array()?
        .iter()
        .find(|s| s["project"].as_str() == Some(&project.display().to_string()))
        .and_then(|s| s["id"].as_str().map(str::to_owned))
}

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let name = mode.name().to_owned();
    let allowlist: PathBuf = mode.home.join(".config/agent-sandbox/allowed-hosts");
    let a = s.project("live-a");
    let b = s.project("live-b");
    s.copy_script(&a, "live.sh");
    s.copy_script(&b, "live_other.sh");
    let ca = s
        .launcher_command(&a, &["--exec", "bash", "./live.sh"], &[])
        .spawn()
        .unwrap();
    let cb = s
        .launcher_command(&b, &["--exec", "bash", "./live_other.sh"], &[])
        .spawn()
        .unwrap();
    let up = s.wait_for_sandbox(&a) && s.wait_for_sandbox(&b);
    s.checks
        .check(up, format!("[{name}] two live sessions started"));
    let (id_a, id_b) = (session_of(&mode, &a), session_of(&mode, &b));
    s.checks.check(
        id_a.is_some() && id_b.is_some(),
        format!("[{name}] `sessions --json` lists both sessions: {id_a:?} {id_b:?}"),
    );
    let (id_a, id_b) = (id_a.unwrap_or_default(), id_b.unwrap_or_default());
    let (table, _) = live(&mode, &["sessions"]);
    s.checks.check(
        String::from_utf8_lossy(&table.stdout).contains(&id_a),
        format!("[{name}] `sessions` lists them: {}", text(&table)),
    );

    // `blocked --follow` from before the refusals on.
    let mut follow = mode
        .command(LAUNCHER, &[])
        .args(["blocked", "--follow"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel::<(f64, bool, Vec<u8>)>();
    for (is_out, pipe) in [
        (
            true,
            follow
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
        (
            false,
            follow
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        let pipe = pipe.unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).split(b'\n') {
                let Ok(line) = line else { break };
                if tx.send((now(), is_out, line)).is_err() {
                    break;
                }
            }
        });
    }
    let wait_line = |needle: &str, stdout: bool| -> Option<(f64, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match lines.recv_timeout(left) {
                Ok((at, is_out, line))
                    if is_out == stdout && String::from_utf8_lossy(&line).contains(needle) =>
                {
                    return Some((at, line))
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    let following = wait_line("following", false).is_some();
    s.checks
        .check(following, format!("[{name}] `blocked --follow` starts"));

    // 1: refusals, printed by --follow within a second, terminal escapes escaped.
    let p1 = phase(&a, 1);
    let seen = wait_line("blocked.test", true);
    let refused_at: f64 = fs::read_to_string(a.join("refused-at"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0.0);
    let delay = seen.as_ref().map(|(at, _)| at - refused_at);
    s.checks.check(
        p1 && delay.is_some_and(|d| d < 1.0),
        format!("[{name}] `blocked --follow` prints a refused name within 1 s of the refusal: {delay:?} s"),
    );
    let evil = wait_line("evil", true);
    s.checks.check(
        // Whatever form the name takes on its way (DNS presentation escapes, the router's, ours), only
        // printable ASCII reaches the terminal.
        evil.as_ref()
            .is_some_and(|(_, l)| l.iter().all(|b| (0x20..0x7f).contains(b)) && l.contains(&b'\\')),
        format!(
            "[{name}] a name of terminal escape bytes is printed escaped: {:?}",
            evil.as_ref()
                .map(|(_, l)| String::from_utf8_lossy(l).into_owned())
        ),
    );

    // 2: `allow blocked.test` reaches both sessions.
    let (out, took) = live(&mode, &["allow", "blocked.test"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let applied: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("applied in"))
        .collect();
    s.checks.check(
        out.status.success()
            && stdout.contains(&id_a)
            && stdout.contains(&id_b)
            && applied.len() >= 2,
        format!(
            "[{name}] `allow blocked.test` is applied to both sessions: {}",
            text(&out)
        ),
    );
    eprintln!(
        "  [{name}] `allow` took {} ms end to end: {}",
        took.as_millis(),
        applied.join(" | ")
    );
    s.checks.check(
        took < Duration::from_secs(1),
        format!(
            "[{name}] `allow` applies within 1 s ({} ms)",
            took.as_millis()
        ),
    );
    let file = fs::read_to_string(&allowlist).unwrap_or_default();
    s.checks.check(
        file.contains("# added by `agent-sandbox allow` on ")
            && file.lines().any(|l| l == "blocked.test"),
        format!("[{name}] the entry is appended to the file with a dated comment"),
    );
    let p2 = phase(&a, 2);
    fs::write(b.join("go"), "").unwrap();
    let rb = finish(cb, Duration::from_secs(120));
    s.checks.check(
        p2 && rb.code == Some(0),
        format!("[{name}] both sessions ran: {}", rb.stderr.trim()),
    );
    s.checks.script(&mode, &rb.stdout, &["other-session-http"]);

    // An invalid entry changes nothing.
    let before = fs::read(&allowlist).unwrap_or_default();
    let (out, _) = live(&mode, &["allow", "good.test", "1.2.3.4"]);
    s.checks.check(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("`1.2.3.4`")
            && fs::read(&allowlist).unwrap_or_default() == before,
        format!(
            "[{name}] an invalid entry is refused and changes nothing: {}",
            text(&out)
        ),
    );

    // 3: a host:port entry.
    let (out, took) = live(&mode, &["allow", "blocked.test:5432"]);
    eprintln!(
        "  [{name}] a second `allow` (host:port: new router port and relay) took {} ms end to end: {}",
        took.as_millis(),
        String::from_utf8_lossy(&out.stdout).trim().replace('\n', " | ")
    );
    s.checks.check(
        out.status.success(),
        format!("[{name}] `allow blocked.test:5432`: {}", text(&out)),
    );
    let p3 = phase(&a, 3);

    // A name only a wildcard allows: said so, nothing changed.
    let before = fs::read(&allowlist).unwrap_or_default();
    let (out, _) = live(&mode, &["deny", "www.wild.test"]);
    s.checks.check(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("allowed by `.wild.test`")
            && fs::read(&allowlist).unwrap_or_default() == before,
        format!(
            "[{name}] denying a name only a wildcard allows changes nothing: {}",
            text(&out)
        ),
    );

    // 4: deny.
    let (out, _) = live(&mode, &["deny", "blocked.test", "blocked.test:5432"]);
    let file = fs::read_to_string(&allowlist).unwrap_or_default();
    s.checks.check(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("go on")
            && !file.lines().any(|l| l.starts_with("blocked.test")),
        format!(
            "[{name}] `deny` removes the lines and applies: {}",
            text(&out)
        ),
    );
    let p4 = phase(&a, 4);

    // `blocked ID`: the refusals so far, with counts.
    let (out, _) = live(&mode, &["blocked", &id_a]);
    s.checks.check(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("blocked.test"),
        format!(
            "[{name}] `blocked ID` lists the refused names: {}",
            text(&out)
        ),
    );

    // `reload` after a hand edit: an invalid line is reported with file:line and nothing is applied;
    // a valid file is applied.
    let good = fs::read_to_string(&allowlist).unwrap_or_default();
    fs::write(&allowlist, format!("{good}10.0.0.1\n")).unwrap();
    let bad_line = good.lines().count() + 1;
    let (out, _) = live(&mode, &["reload"]);
    s.checks.check(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr)
                .contains(&format!("allowed-hosts:{bad_line}: `10.0.0.1`")),
        format!(
            "[{name}] `reload` of an invalid file names file:line and applies nothing: {}",
            text(&out)
        ),
    );
    fs::write(&allowlist, &good).unwrap();
    let (out, _) = live(&mode, &["reload"]);
    s.checks.check(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("applied in"),
        format!("[{name}] `reload` applies a valid file: {}", text(&out)),
    );

    // 5: `allow --session` leaves the file as it was.
    let before = fs::read(&allowlist).unwrap_or_default();
    let (out, _) = live(&mode, &["allow", "--session", &id_a, ".blocked.test"]);
    s.checks.check(
        out.status.success() && fs::read(&allowlist).unwrap_or_default() == before,
        format!(
            "[{name}] `allow --session` applies and leaves the file unchanged: {}",
            text(&out)
        ),
    );
    let p5 = phase(&a, 5);

    let ra = finish(ca, Duration::from_secs(120));
    let _ = follow.kill();
    let _ = follow.wait();
    s.checks.check(
        p3 && p4 && p5 && ra.code == Some(0),
        format!(
            "[{name}] the live session ran through every phase: {}",
            ra.stderr.trim()
        ),
    );
    s.checks.script(
        &mode,
        &ra.stdout,
        &[
            "before-nxdomain",
            "plain-resolves",
            "plain-http",
            "port-new-address",
            "port-old-address-kept",
            "port-tcp",
            "port-host-http",
            "deny-nxdomain",
            "deny-http-refused",
            "deny-port-refused",
            "wildcard-apex",
            "wildcard-sub",
            "wildcard-http",
        ],
    );
    // Later scenarios read the suite's allowlist.
    fs::write(&allowlist, ALLOWLIST).unwrap();
}
