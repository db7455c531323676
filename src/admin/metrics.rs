//! `/metrics`: the Prometheus text exposition format (version 0.0.4), written by hand.
//!
//! Counters are read from where they are kept ([`PickCounters`](crate::balancer::PickCounters),
//! [`GrpcMetrics`](crate::grpc::metrics::GrpcMetrics)); gauges are computed at scrape time
//! from the current catalog and the balancer's statistics, so they cannot drift from what
//! picks see. Every registered instance has a `rota_breaker_open` series (0 or 1), and every
//! service a `rota_instances` series per status, zeros included, so a series does not vanish
//! when its value drops to nothing. Instances are labelled `instance_id`, never `instance`,
//! which Prometheus gives the scraped target; durations are in seconds. `rota_build_info` and
//! the [process metrics](super::process) complete what `promtool check metrics` expects.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AdminState;
use crate::balancer::PICK_BUCKETS;
use crate::grpc::metrics::HANDLING_BUCKETS;
use crate::overload::Pressure;
use crate::registry::Status;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn scrape(State(state): State<AdminState>) -> impl IntoResponse {
    let mut out = render(&state);
    if let Some(stats) = super::process::read().await {
        super::process::render(&stats, &mut out);
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], out)
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

pub fn render(state: &AdminState) -> String {
    let mut out = String::new();
    header(&mut out, "rota_build_info", "gauge", "Always 1; the labels say which rota build is running.");
    let _ = writeln!(out, "rota_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    render_picks(state, &mut out);
    render_catalog(state, &mut out);
    render_grpc(state, &mut out);
    render_limits(state, &mut out);
    render_policies(state, &mut out);
    render_xds(state, &mut out);
    render_memory(state, &mut out);
    render_overload(state, &mut out);
    render_sources(state, &mut out);
    render_health_checks(state, &mut out);
    out
}

fn render_health_checks(state: &AdminState, out: &mut String) {
    let Some(counters) = &state.health_checks else { return };
    header(
        out,
        "rota_health_checked_instances",
        "gauge",
        "Instances rota's active health checks ask (announced UP, in a service with a health_check).",
    );
    let _ = writeln!(out, "rota_health_checked_instances {}", counters.checked.load(Ordering::Relaxed));
    header(
        out,
        "rota_health_failing_instances",
        "gauge",
        "Checked instances failing their health check: published DOWN, no picks.",
    );
    let _ = writeln!(out, "rota_health_failing_instances {}", counters.failing.load(Ordering::Relaxed));
    header(out, "rota_health_checks_in_flight", "gauge", "Health checks running now (at most 256).");
    let _ = writeln!(out, "rota_health_checks_in_flight {}", counters.in_flight.load(Ordering::Relaxed));
    header(out, "rota_health_checks_total", "counter", "Health checks finished, by result.");
    let _ = writeln!(out, "rota_health_checks_total{{result=\"pass\"}} {}", counters.passed.load(Ordering::Relaxed));
    let _ = writeln!(out, "rota_health_checks_total{{result=\"fail\"}} {}", counters.failed.load(Ordering::Relaxed));
}

fn render_sources(state: &AdminState, out: &mut String) {
    let views = state.sources.views();
    if views.is_empty() {
        return;
    }
    header(out, "rota_source_up", "gauge", "1 when a followed registry's last read succeeded, 0 while it is stale.");
    for v in &views {
        let _ =
            writeln!(out, "rota_source_up{{source=\"{}\",kind=\"{}\"}} {}", escape(&v.name), v.kind, u8::from(v.up));
    }
    header(out, "rota_source_instances", "gauge", "Instances rota holds of a followed registry.");
    for v in &views {
        let _ = writeln!(out, "rota_source_instances{{source=\"{}\"}} {}", escape(&v.name), v.instances);
    }
    header(
        out,
        "rota_source_refused",
        "gauge",
        "Entries of a registry's last listing rota refused (malformed, invalid, over max_instances).",
    );
    for v in &views {
        let _ = writeln!(out, "rota_source_refused{{source=\"{}\"}} {}", escape(&v.name), v.refused);
    }
    header(
        out,
        "rota_source_held_back",
        "gauge",
        "Services whose removals rota holds back (more than protect_threshold at once).",
    );
    for v in &views {
        let _ = writeln!(out, "rota_source_held_back{{source=\"{}\"}} {}", escape(&v.name), v.held_back.len());
    }
    header(out, "rota_source_reads_total", "counter", "Reads of a followed registry, by result.");
    for v in &views {
        let name = escape(&v.name);
        let _ = writeln!(out, "rota_source_reads_total{{source=\"{name}\",result=\"ok\"}} {}", v.reads);
        let _ = writeln!(out, "rota_source_reads_total{{source=\"{name}\",result=\"failed\"}} {}", v.failures);
    }
}

fn render_xds(state: &AdminState, out: &mut String) {
    let Some(hub) = &state.xds else { return };
    let counters = &hub.counters;
    let limits = hub.limits();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    header(out, "rota_xds_streams", "gauge", "Open xDS (ADS) streams.");
    let _ = writeln!(out, "rota_xds_streams {}", counters.streams.load(Ordering::Relaxed));
    header(out, "rota_xds_subscriptions", "gauge", "Services subscribed to over xDS, summed over every stream.");
    let _ = writeln!(out, "rota_xds_subscriptions {}", counters.subscriptions.load(Ordering::Relaxed));
    header(
        out,
        "rota_xds_limit",
        "gauge",
        "xDS bounds (server.max_xds_subscriptions, server.max_xds_names_per_stream).",
    );
    let _ = writeln!(out, "rota_xds_limit{{scope=\"subscriptions\"}} {}", limits.max_subscriptions);
    let _ = writeln!(out, "rota_xds_limit{{scope=\"names_per_stream\"}} {}", limits.max_names_per_stream);
    header(out, "rota_xds_responses_total", "counter", "xDS responses sent.");
    let _ = writeln!(out, "rota_xds_responses_total {}", load(&counters.responses));
    header(out, "rota_xds_acks_total", "counter", "xDS responses a client acknowledged.");
    let _ = writeln!(out, "rota_xds_acks_total {}", load(&counters.acks));
    header(out, "rota_xds_nacks_total", "counter", "xDS responses a client rejected (NACK).");
    let _ = writeln!(out, "rota_xds_nacks_total {}", load(&counters.nacks));
    header(out, "rota_xds_unknown_types_total", "counter", "xDS requests for a resource type rota does not serve.");
    let _ = writeln!(out, "rota_xds_unknown_types_total {}", load(&counters.unknown_types));
    header(out, "rota_xds_refused_total", "counter", "xDS streams ended because a request passed a bound.");
    let _ = writeln!(out, "rota_xds_refused_total {}", load(&counters.refused));
    header(out, "rota_xds_builds_total", "counter", "Builds of a service's xDS resources (once per change).");
    let _ = writeln!(out, "rota_xds_builds_total {}", load(&counters.builds));
}

/// Memory held for outside parties, by class: one family, whatever holds it.
fn render_memory(state: &AdminState, out: &mut String) {
    let mut classes: Vec<(&str, usize, usize, usize, u64)> = Vec::new();
    if let Some((_, _, answers)) = &state.limits {
        classes.push(("unread_answers", answers.held(), answers.limit(), answers.per_peer_limit(), answers.refused()));
    }
    if let Some(hub) = &state.xds {
        let memory = hub.memory();
        classes.push((memory.class(), memory.held(), memory.limit(), memory.share(), memory.refused()));
    }
    header(out, "rota_memory_held_bytes", "gauge", "Bytes rota holds for outside parties, by class, as charged.");
    for (class, held, ..) in &classes {
        let _ = writeln!(out, "rota_memory_held_bytes{{class=\"{class}\"}} {held}");
    }
    header(out, "rota_memory_limit_bytes", "gauge", "Each class's budget, in total and per client address.");
    for (class, _, limit, share, _) in &classes {
        let _ = writeln!(out, "rota_memory_limit_bytes{{class=\"{class}\",scope=\"total\"}} {limit}");
        let _ = writeln!(out, "rota_memory_limit_bytes{{class=\"{class}\",scope=\"per_peer\"}} {share}");
    }
    header(out, "rota_memory_refused_total", "counter", "Charges refused for want of room, by class.");
    for (class, .., refused) in &classes {
        let _ = writeln!(out, "rota_memory_refused_total{{class=\"{class}\"}} {refused}");
    }
}

fn render_overload(state: &AdminState, out: &mut String) {
    let Some(overload) = &state.overload else { return };
    let Some(limit) = overload.limit() else { return };
    header(out, "rota_overload_limit_bytes", "gauge", "Resident memory limit (server.max_rss_bytes).");
    let _ = writeln!(out, "rota_overload_limit_bytes {limit}");
    header(out, "rota_overload_resident_bytes", "gauge", "Resident memory at the last overload sample.");
    let _ = writeln!(out, "rota_overload_resident_bytes {}", overload.rss());
    header(out, "rota_overload_pressure", "gauge", "1 for the memory pressure level in force.");
    for level in [Pressure::Normal, Pressure::Refusing, Pressure::Shedding] {
        let on = u8::from(overload.pressure() == level);
        let _ = writeln!(out, "rota_overload_pressure{{level=\"{}\"}} {on}", level.as_str());
    }
    header(out, "rota_overload_streams_total", "counter", "Watch and xDS streams refused or ended for memory.");
    let _ = writeln!(out, "rota_overload_streams_total{{action=\"refused\"}} {}", overload.refused());
    let _ = writeln!(out, "rota_overload_streams_total{{action=\"shed\"}} {}", overload.shed());
}

fn render_policies(state: &AdminState, out: &mut String) {
    header(out, "rota_policy_overrides", "gauge", "Runtime policy overrides in force (SetPolicy).");
    let _ = writeln!(out, "rota_policy_overrides {}", state.overview.runtime_overrides());
    header(out, "rota_policy_overrides_limit", "gauge", "The cap on runtime policy overrides.");
    let _ = writeln!(out, "rota_policy_overrides_limit {}", crate::policy::MAX_RUNTIME_OVERRIDES);
    if let Some(reloads) = &state.policy_reloads {
        let reloads = *reloads.borrow();
        header(out, "rota_policy_reloads_total", "counter", "Reloads of the policy file, applied or refused.");
        let _ = writeln!(out, "rota_policy_reloads_total{{result=\"applied\"}} {}", reloads.applied);
        let _ = writeln!(out, "rota_policy_reloads_total{{result=\"refused\"}} {}", reloads.refused);
    }
}

fn render_limits(state: &AdminState, out: &mut String) {
    let sticky = state.overview.sticky_usage();
    header(out, "rota_sticky_entries", "gauge", "Sticky assignments held.");
    let _ = writeln!(out, "rota_sticky_entries {}", sticky.entries);
    header(out, "rota_sticky_bytes", "gauge", "Memory held by sticky assignments, as accounted against its budget.");
    let _ = writeln!(out, "rota_sticky_bytes {}", sticky.bytes);
    header(
        out,
        "rota_sticky_budget_bytes",
        "gauge",
        "The sticky assignments' memory budget (server.sticky_memory_bytes).",
    );
    let _ = writeln!(out, "rota_sticky_budget_bytes {}", sticky.budget);
    header(out, "rota_sticky_refused_total", "counter", "New sticky assignments not remembered: the budget was spent.");
    let _ = writeln!(out, "rota_sticky_refused_total {}", sticky.refused);
    let Some((connections, streams, answers)) = &state.limits else { return };
    let counts = connections.counts();
    let limits = connections.limits();
    header(out, "rota_connections", "gauge", "Open gRPC connections.");
    let _ = writeln!(out, "rota_connections {}", counts.open);
    header(
        out,
        "rota_connections_limit",
        "gauge",
        "Connection caps (server.max_connections, server.max_connections_per_peer).",
    );
    let _ = writeln!(out, "rota_connections_limit{{scope=\"total\"}} {}", limits.max_connections);
    let _ = writeln!(out, "rota_connections_limit{{scope=\"per_peer\"}} {}", limits.max_connections_per_peer);
    header(out, "rota_connections_refused_total", "counter", "Connections closed at once because a cap was reached.");
    let _ = writeln!(out, "rota_connections_refused_total{{cap=\"total\"}} {}", counts.refused_total_cap);
    let _ = writeln!(out, "rota_connections_refused_total{{cap=\"per_peer\"}} {}", counts.refused_peer_cap);
    header(
        out,
        "rota_connections_closed_total",
        "counter",
        "Connections closed by rota: handshake timeout or failure, idle timeout.",
    );
    let _ =
        writeln!(out, "rota_connections_closed_total{{reason=\"handshake_timeout\"}} {}", counts.handshake_timeouts);
    let _ = writeln!(out, "rota_connections_closed_total{{reason=\"handshake_failed\"}} {}", counts.handshake_failures);
    let _ = writeln!(out, "rota_connections_closed_total{{reason=\"idle_timeout\"}} {}", counts.idle_timeouts);
    header(out, "rota_open_streams", "gauge", "Open Register, Watch and PickStream streams.");
    let _ = writeln!(out, "rota_open_streams {}", streams.open());
    header(out, "rota_open_streams_limit", "gauge", "The cap on open streams (server.max_open_streams).");
    let _ = writeln!(out, "rota_open_streams_limit {}", streams.limit());
    header(out, "rota_streams_refused_total", "counter", "Streams refused with RESOURCE_EXHAUSTED at the cap.");
    let _ = writeln!(out, "rota_streams_refused_total {}", streams.refused());
    header(
        out,
        "rota_unread_bytes",
        "gauge",
        "Bytes of listings, leases and watch events sent to clients and not read by them yet.",
    );
    let _ = writeln!(out, "rota_unread_bytes {}", answers.held());
    header(out, "rota_unread_bytes_limit", "gauge", "The budgets of unread answer bytes.");
    let _ = writeln!(out, "rota_unread_bytes_limit{{scope=\"total\"}} {}", answers.limit());
    let _ = writeln!(out, "rota_unread_bytes_limit{{scope=\"per_peer\"}} {}", answers.per_peer_limit());
    header(
        out,
        "rota_unread_refused_total",
        "counter",
        "Listings and leases refused with RESOURCE_EXHAUSTED for want of room in those budgets.",
    );
    let _ = writeln!(out, "rota_unread_refused_total {}", answers.refused());
}

fn render_picks(state: &AdminState, out: &mut String) {
    let counters = state.overview.counters();
    header(out, "rota_picks_total", "counter", "Picks and leases by service, rule and result.");
    for pick in counters.picks() {
        let _ = writeln!(
            out,
            "rota_picks_total{{service=\"{}\",rule=\"{}\",result=\"{}\"}} {}",
            escape(&pick.service),
            escape(&pick.rule),
            pick.result.as_str(),
            pick.count
        );
    }
    header(out, "rota_fallback_picks_total", "counter", "Successful picks and leases that took a fallback.");
    for (service, count) in counters.fallbacks() {
        let _ = writeln!(out, "rota_fallback_picks_total{{service=\"{}\"}} {count}", escape(&service));
    }
    let latency = state.overview.pick_latency().snapshot();
    header(
        out,
        "rota_pick_duration_seconds",
        "histogram",
        "Time rota took to answer a pick (Pick, each PickStream pick), from the request read to the answer, refusals included.",
    );
    for (le, count) in PICK_BUCKETS.iter().zip(&latency.cumulative) {
        let _ = writeln!(out, "rota_pick_duration_seconds_bucket{{le=\"{le}\"}} {count}");
    }
    let total = latency.cumulative[PICK_BUCKETS.len()];
    let _ = writeln!(out, "rota_pick_duration_seconds_bucket{{le=\"+Inf\"}} {total}");
    let _ = writeln!(out, "rota_pick_duration_seconds_sum {}", latency.sum_seconds);
    let _ = writeln!(out, "rota_pick_duration_seconds_count {total}");
}

fn render_catalog(state: &AdminState, out: &mut String) {
    let catalog = state.overview.catalog();
    let mut services: Vec<_> = catalog.snapshots().collect();
    services.sort_by(|a, b| a.name.cmp(&b.name));

    header(out, "rota_instances", "gauge", "Registered instances by service and status.");
    for snapshot in &services {
        for status in [Status::Up, Status::Draining, Status::Down] {
            let count = snapshot.instances.iter().filter(|i| i.status == status).count();
            let _ = writeln!(
                out,
                "rota_instances{{service=\"{}\",status=\"{}\"}} {count}",
                escape(&snapshot.name),
                status.as_str()
            );
        }
    }
    header(out, "rota_registration_streams", "gauge", "Open Register streams.");
    let _ = writeln!(out, "rota_registration_streams {}", state.overview.open_leases());

    // The in-process backend cannot be unreachable; a shared backend reports its link here.
    header(out, "rota_state_backend_up", "gauge", "1 while the state backend answers.");
    let (backend, up) = state.overview.state_backend();
    let _ = writeln!(out, "rota_state_backend_up{{backend=\"{backend}\"}} {}", u8::from(up));
    if let Some(link) = state.overview.link() {
        header(
            out,
            "rota_state_data_losses_total",
            "counter",
            "Times this replica found that Redis had lost rota's data, or may have (a Sentinel failover); rotations then resume from a new floor.",
        );
        let _ = writeln!(out, "rota_state_data_losses_total {}", link.losses());
        header(
            out,
            "rota_state_draws_waiting",
            "gauge",
            "Picks waiting for their ticket from Redis (queued, or in the call under way).",
        );
        let _ = writeln!(out, "rota_state_draws_waiting {}", link.draws_waiting());
        header(
            out,
            "rota_state_draw_calls_total",
            "counter",
            "Calls made to Redis to draw tickets; each draws for every pick waiting when it starts.",
        );
        let _ = writeln!(out, "rota_state_draw_calls_total {}", link.draw_calls());
        header(
            out,
            "rota_replica_propagation_lag_seconds",
            "gauge",
            "How long the last change of each other replica's instances took to reach this replica.",
        );
        for (replica, lag) in link.propagation().last() {
            let _ =
                writeln!(out, "rota_replica_propagation_lag_seconds{{replica=\"{replica}\"}} {}", lag.as_secs_f64());
        }
        header(
            out,
            "rota_replica_propagation_lag_limit_seconds",
            "gauge",
            "The propagation lag past which this replica reports itself degraded (server.replica_lag_limit).",
        );
        let _ =
            writeln!(out, "rota_replica_propagation_lag_limit_seconds {}", link.propagation().limit().as_secs_f64());
    }

    header(out, "rota_breaker_open", "gauge", "1 while an instance's circuit breaker is open.");
    let reports: Vec<Vec<_>> = services
        .iter()
        .map(|s| s.instances.iter().map(|i| state.overview.instance_stats(&s.name, &i.id)).collect())
        .collect();
    let each = |out: &mut String, write: &dyn Fn(&mut String, &str, &crate::load::InstanceReport)| {
        for (snapshot, reports) in services.iter().zip(&reports) {
            for (instance, report) in snapshot.instances.iter().zip(reports) {
                let labels = format!("service=\"{}\",instance_id=\"{}\"", escape(&snapshot.name), escape(&instance.id));
                write(out, &labels, report);
            }
        }
    };
    each(out, &|out, labels, report| {
        let _ = writeln!(out, "rota_breaker_open{{{labels}}} {}", u8::from(report.load.tripped));
    });
    // Labels name registered instances only, never what a client sent.
    header(
        out,
        "rota_instance_calls_total",
        "counter",
        "Calls consumers reported for an instance (leased calls included), by result.",
    );
    each(out, &|out, labels, report| {
        let _ = writeln!(out, "rota_instance_calls_total{{{labels},result=\"ok\"}} {}", report.calls - report.errors);
        let _ = writeln!(out, "rota_instance_calls_total{{{labels},result=\"error\"}} {}", report.errors);
    });
    header(
        out,
        "rota_instance_latency_seconds",
        "gauge",
        "The latency average rota holds for an instance, in seconds (failed calls count as slow); NaN until a call is reported.",
    );
    each(out, &|out, labels, report| {
        let latency = report.load.latency_ms.map_or_else(|| "NaN".to_owned(), |ms| format!("{:.6}", ms / 1000.0));
        let _ = writeln!(out, "rota_instance_latency_seconds{{{labels}}} {latency}");
    });
}

fn render_grpc(state: &AdminState, out: &mut String) {
    let methods = state.grpc.snapshot();
    let labels = |m: &crate::grpc::metrics::MethodStats| {
        format!("grpc_method=\"{}\",grpc_service=\"{}\",grpc_type=\"{}\"", m.method, m.service, m.kind)
    };
    header(out, "grpc_server_started_total", "counter", "RPCs started on the server.");
    for method in &methods {
        let _ = writeln!(out, "grpc_server_started_total{{{}}} {}", labels(method), method.started);
    }
    header(out, "grpc_server_handled_total", "counter", "RPCs completed on the server, by status code.");
    for method in &methods {
        for (code, count) in &method.handled {
            let _ = writeln!(out, "grpc_server_handled_total{{grpc_code=\"{code}\",{}}} {count}", labels(method));
        }
    }
    header(
        out,
        "grpc_server_handling_seconds",
        "histogram",
        "Time from the request to the end of the response (for streams: the stream's life).",
    );
    for method in &methods {
        let labels = labels(method);
        for (le, count) in HANDLING_BUCKETS.iter().zip(&method.cumulative) {
            let _ = writeln!(out, "grpc_server_handling_seconds_bucket{{{labels},le=\"{le}\"}} {count}");
        }
        let total = method.cumulative.last().copied().unwrap_or(0);
        let _ = writeln!(out, "grpc_server_handling_seconds_bucket{{{labels},le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "grpc_server_handling_seconds_sum{{{labels}}} {}", method.sum_seconds);
        let _ = writeln!(out, "grpc_server_handling_seconds_count{{{labels}}} {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
