use super::*;

fn instance(id: &str, version: &str, status: pb::InstanceStatus) -> pb::Instance {
    pb::Instance {
        id: id.into(),
        service: "svc".into(),
        host: "127.0.0.1".into(),
        port: 9000,
        version: version.into(),
        status: status.into(),
        ..Default::default()
    }
}

fn up(id: &str, version: &str) -> pb::Instance {
    instance(id, version, pb::InstanceStatus::Up)
}

fn snapshot(epoch: u64, instances: Vec<pb::Instance>) -> pb::WatchEvent {
    pb::WatchEvent { epoch, event: Some(Event::Snapshot(pb::InstanceList { instances })) }
}

fn event(epoch: u64, event: Event) -> pb::WatchEvent {
    pb::WatchEvent { epoch, event: Some(event) }
}

/// `(id, ticket, fallback is set)` of `count` local picks.
fn picks(shared: &Shared, version: &str, exclude: &[&str], count: usize) -> Vec<(String, u64, bool)> {
    let exclude: Vec<String> = exclude.iter().map(|id| id.to_string()).collect();
    (0..count)
        .map(|_| {
            let local = shared.pick("svc", version, &exclude).expect("followed").expect("eligible");
            (local.instance.id, local.ticket, !local.fallback.is_empty())
        })
        .collect()
}

fn ids(picked: &[(String, u64, bool)]) -> Vec<&str> {
    picked.iter().map(|(id, _, _)| id.as_str()).collect()
}

fn tickets(picked: &[(String, u64, bool)]) -> Vec<u64> {
    picked.iter().map(|(_, ticket, _)| *ticket).collect()
}

fn fleet() -> Shared {
    let shared = Shared::default();
    shared.apply(
        "svc",
        snapshot(
            3,
            vec![
                up("b", ""),
                up("a", ""),
                instance("d", "", pb::InstanceStatus::Draining),
                up("c", ""),
                up("zlt-1", "zlt"),
                up("zlt-2", "zlt"),
            ],
        ),
    );
    shared
}

#[test]
fn a_service_without_a_list_has_no_local_pick() {
    let shared = Shared::default();
    assert!(shared.pick("svc", "", &[]).is_none());
    assert!(!shared.synced("svc"));
    // Events before the first snapshot do not make a list to fall back on.
    shared.apply("svc", event(1, Event::Added(up("a", ""))));
    assert!(shared.pick("svc", "", &[]).is_none());
    assert_eq!(shared.instances("svc"), None);
}

#[test]
fn tickets_count_per_service_and_subset_round_robin_over_up_instances_by_id() {
    let shared = fleet();
    let unversioned = picks(&shared, "", &[], 4);
    assert_eq!(ids(&unversioned), ["a", "b", "c", "a"]);
    assert_eq!(tickets(&unversioned), [0, 1, 2, 3]);
    let zlt = picks(&shared, "zlt", &[], 3);
    assert_eq!(ids(&zlt), ["zlt-1", "zlt-2", "zlt-1"]);
    assert_eq!(tickets(&zlt), [0, 1, 2], "a subset of its own counts from 0");
    assert!(zlt.iter().chain(&unversioned).all(|(_, _, fallback)| !fallback));
    // A version with no instance falls back to the unversioned subset, shares its counter and
    // says so.
    let nobody = picks(&shared, "nobody", &[], 1);
    assert_eq!(nobody, [("b".to_owned(), 4, true)]);
    let local = shared.pick("svc", "nobody", &[]).unwrap().unwrap();
    assert_eq!(local.fallback, "no instance with version \"nobody\"; picked from instances with no version");
    assert_eq!(local.epoch, 3);
}

#[test]
fn exclusion_rotates_over_the_instances_not_excluded() {
    let shared = fleet();
    let picked = picks(&shared, "", &["b"], 4);
    assert_eq!(ids(&picked), ["a", "c", "a", "c"]);
    assert_eq!(tickets(&picked), [0, 1, 2, 3]);
}

#[test]
fn an_all_excluded_subset_never_falls_through_to_another() {
    let shared = fleet();
    let exclude = ["zlt-1".to_owned(), "zlt-2".to_owned()];
    let why = shared.pick("svc", "zlt", &exclude).unwrap().unwrap_err();
    assert!(why.contains("version \"zlt\"") && why.contains("not excluded"), "{why}");
    let why = shared.pick("svc", "", &["a".into(), "b".into(), "c".into()]).unwrap().unwrap_err();
    assert!(why.contains("no version"), "{why}");
    // No ticket was drawn by the failures.
    assert_eq!(tickets(&picks(&shared, "zlt", &[], 1)), [0]);
}

#[test]
fn events_update_the_list_and_an_empty_snapshot_at_epoch_0_does_not_wipe_it() {
    let shared = fleet();
    shared.apply("svc", event(4, Event::Removed(pb::InstanceRef { service: "svc".into(), id: "a".into() })));
    shared.apply("svc", event(5, Event::Updated(instance("b", "", pb::InstanceStatus::Draining))));
    shared.apply("svc", event(6, Event::Added(up("e", ""))));
    assert_eq!(ids(&picks(&shared, "", &[], 2)), ["c", "e"]);
    // A restarted rota that has not seen the service yet: its empty list is ignored ...
    shared.apply("svc", snapshot(0, vec![]));
    let kept: Vec<String> = shared.instances("svc").unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(kept, ["b", "c", "d", "e", "zlt-1", "zlt-2"]);
    // ... a later epoch's empty list is rota's word.
    shared.apply("svc", snapshot(7, vec![]));
    assert_eq!(shared.instances("svc"), Some(vec![]));
    assert!(shared.pick("svc", "", &[]).unwrap().is_err());
}

#[test]
fn three_unreachable_picks_in_a_row_short_cut_for_one_second() {
    let mut outage = Outage::default();
    let start = Instant::now();
    for _ in 1..SHORTCUT_AFTER {
        outage.unreachable(start);
        assert!(!outage.shortcut(start));
    }
    outage.unreachable(start);
    assert!(outage.shortcut(start));
    assert!(outage.shortcut(start + SHORTCUT_FOR - Duration::from_millis(1)));
    assert!(!outage.shortcut(start + SHORTCUT_FOR), "rota is asked again after the short-cut");
    // One answer from rota resets the count.
    outage.unreachable(start);
    assert!(outage.shortcut(start));
    outage.answered();
    outage.unreachable(start);
    assert!(!outage.shortcut(start));
}

#[test]
fn an_outage_warns_once_and_once_more_on_recovery() {
    let mut outage = Outage::default();
    assert!(!outage.answered(), "no outage, nothing to recover from");
    assert!(outage.picked_locally());
    assert!(!outage.picked_locally());
    assert!(!outage.picked_locally());
    assert!(outage.answered());
    assert!(!outage.answered());
    assert!(outage.picked_locally(), "a new outage warns again");
}
