//! `just simulate SECONDS [SEED]`: the deterministic simulation (tests/sim). Runs schedules
//! from SEED on (a fresh seed from the clock when none is given, printed) for SECONDS of
//! wall time, checks each one's history, and for a violation prints its seed, the shortest
//! failing history it finds and the command that replays it; exits non-zero on any
//! violation.
//!
//! `simulate replay SEED [STEPS]` runs one schedule and prints its history.
//! With no arguments (as `cargo test` runs it): the regression seeds, a replay check (one
//! seed run twice gives the same history) and a few seconds of fresh seeds.

#[path = "sim/mod.rs"]
mod sim;

use std::time::{Duration, Instant};

use sim::{Plan, check::check};

/// Seeds that found bugs once, kept so that each stays found: 587, a semaphore's limit
/// lowered during a restart grace (three permits granted at its end under a limit of one);
/// 795865791, the checker's own: a limit change in flight after a loss taken as made;
/// 21065, a keep-alive driver starved past a deadline went on renewing the session a check
/// had found lost, whose entries then blocked two mutexes for good.
const REGRESSION_SEEDS: &[u64] = &[587, 795_865_791, 21_065];

/// The build a printed seed replays in: `just simulate` makes a release build, `just
/// simulate-dev` (CI) runs the debug one `just test` makes; `just simulate-replay SEED STEPS
/// PROFILE` replays in the same one.
const PROFILE: &str = if cfg!(debug_assertions) {
    "dev"
} else {
    "release"
};

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let stop_at_first = all.iter().any(|a| a == "--stop-at-first");
    // `--fresh-only`: no regression seeds (the mutation run: what fresh schedules find).
    let regression: &[u64] = if all.iter().any(|a| a == "--fresh-only") {
        &[]
    } else {
        REGRESSION_SEEDS
    };
    let args: Vec<String> = all.into_iter().filter(|a| !a.starts_with("--")).collect();
    let code = match args.first().map(String::as_str) {
        Some("replay") => replay(&args[1..]),
        Some(seconds) => match seconds.parse::<f64>() {
            Ok(s) => {
                let seed = args
                    .get(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(fresh_seed);
                campaign(Duration::from_secs_f64(s), seed, regression, stop_at_first)
            }
            // `cargo test` passes test filters: run the default.
            Err(_) => default_run(),
        },
        None => default_run(),
    };
    std::process::exit(code);
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 1_000_000_000)
}

fn default_run() -> i32 {
    campaign(
        Duration::from_secs(5),
        fresh_seed(),
        REGRESSION_SEEDS,
        false,
    )
}

/// Whether `seed` replays bit for bit: two runs, one history.
fn replays(seed: u64) -> bool {
    let plan = Plan::from_seed(seed, None);
    sim::run(&plan).history.events == sim::run(&plan).history.events
}

/// Runs `extra` seeds, then seeds from `first` on, until `budget` is spent (or, with
/// `stop_at_first`, until a violation: what the mutation run wants, without the shrinking).
fn campaign(budget: Duration, first: u64, extra: &[u64], stop_at_first: bool) -> i32 {
    let started = Instant::now();
    println!(
        "simulate: seeds from {first} for {:.0} s (replay one: just simulate-replay SEED 0 {PROFILE})",
        budget.as_secs_f64()
    );
    if sim::REPLAYS {
        if !replays(first) {
            println!("simulate: seed {first} did not replay: two runs, two histories");
            return 1;
        }
    } else {
        println!(
            "simulate: not a tokio_unstable build: tokio::select! is not seeded, so a seed may not replay exactly (.cargo/config.toml sets --cfg tokio_unstable: was RUSTFLAGS set?)"
        );
    }
    let (mut runs, mut bad) = (0u64, 0u64);
    let mut faults = [0u64; sim::net::FAULT_NAMES.len()];
    let mut seeds = extra.iter().copied().chain(first..);
    while started.elapsed() < budget || runs < extra.len() as u64 {
        let Some(seed) = seeds.next() else { break };
        let plan = Plan::from_seed(seed, None);
        let outcome = sim::run(&plan);
        for (total, n) in faults.iter_mut().zip(outcome.faults) {
            *total += n;
        }
        runs += 1;
        let violations = check(&plan, &outcome.history);
        if !violations.is_empty() {
            bad += 1;
            if stop_at_first {
                println!("simulate: VIOLATION with seed {seed}:");
                for v in violations.iter().take(3) {
                    println!("  [{}] {}", v.rule, v.detail);
                }
                return 1;
            }
            report(seed, &plan, &violations);
        }
    }
    let per_minute = runs as f64 * 60.0 / started.elapsed().as_secs_f64().max(0.001);
    let drawn: Vec<String> = sim::net::FAULT_NAMES
        .iter()
        .zip(faults)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    println!(
        "simulate: {runs} schedules ({per_minute:.0} a minute), {bad} violations; faults drawn: {}",
        drawn.join(", ")
    );
    // Every fault kind must have been drawn: a run that drew none of one tested nothing of it.
    if let Some((name, _)) = sim::net::FAULT_NAMES
        .iter()
        .zip(faults)
        .find(|(_, n)| *n == 0)
    {
        println!("simulate: no `{name}` fault was drawn in {runs} schedules: run longer");
        return 1;
    }
    i32::from(bad > 0)
}

/// Prints a failing seed: what broke, the shortest schedule of it that still fails, and how
/// to replay it.
fn report(seed: u64, plan: &Plan, violations: &[sim::check::Violation]) {
    println!("simulate: VIOLATION with seed {seed}:");
    for v in violations.iter().take(5) {
        println!("  [{}] {}", v.rule, v.detail);
    }
    // Shrink: the fewest steps per client that still break a rule.
    let mut shortest = plan.steps;
    for steps in 1..plan.steps {
        let small = Plan::from_seed(seed, Some(steps));
        if !check(&small, &sim::run(&small).history).is_empty() {
            shortest = steps;
            break;
        }
    }
    let small = Plan::from_seed(seed, Some(shortest));
    let history = sim::run(&small).history;
    println!(
        "simulate: shortest failing schedule: {shortest} steps per client ({} events); replay: just simulate-replay {seed} {shortest} {PROFILE}",
        history.events.len()
    );
    for event in history.events.iter().take(400) {
        println!("  {event:?}");
    }
}

fn replay(args: &[String]) -> i32 {
    let Some(seed) = args.first().and_then(|s| s.parse().ok()) else {
        eprintln!("simulate replay SEED [STEPS]");
        return 64;
    };
    // STEPS 0 (or none): the whole schedule.
    let steps = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .filter(|&steps: &usize| steps > 0);
    // BATON_LOG=baton=debug (a tracing filter): the library's own account of the schedule.
    if let Ok(filter) = std::env::var("BATON_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let plan = Plan::from_seed(seed, steps);
    println!("simulate: seed {seed}: {plan:?}");
    let outcome = sim::run(&plan);
    for event in &outcome.history.events {
        println!("  {event:?}");
    }
    let violations = check(&plan, &outcome.history);
    for v in &violations {
        println!("VIOLATION [{}] {}", v.rule, v.detail);
    }
    i32::from(!violations.is_empty())
}
