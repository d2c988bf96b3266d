use super::*;

/// The example configuration (`melddb-log example-config`) parses, and
/// every field it shows has the default, as its header says.
#[test]
fn the_example_config_parses_and_shows_the_defaults() {
    let text = include_str!("../../example.toml");
    let ex = Config::from_toml(text).expect("example.toml parses");
    let def = Config::with_zones(ex.zones.clone());
    let strip = |c: &Config| {
        let mut v = serde_json::to_value(c).unwrap();
        v.as_object_mut().unwrap().remove("tokens");
        v
    };
    assert_eq!(strip(&ex), strip(&def));
    assert_eq!(ex.prepared_segments, defaults::prepared_segments());
    assert_eq!(ex.tuning.prepare_mib_s, defaults::prepare_mib_s());
    assert!(!ex.tuning.disable_transparent_huge_pages);
}

/// The upper bounds hold exactly at their edges, and the messages
/// name the field.
#[test]
fn segment_size_and_the_counts_have_upper_bounds() {
    let ok = Config::with_zones(vec!["a".into(), "b".into(), "c".into()]);
    let mut c = ok.clone();
    c.segment_bytes = MAX_SEGMENT_BYTES;
    assert!(c.validate().is_ok());
    c.segment_bytes += 1;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("segment_bytes must be at most"), "{e}");
    type Field = fn(&mut Config) -> &mut usize;
    let counts: [(&str, Field); 4] = [
        ("limits.max_connections", |c| &mut c.limits.max_connections),
        ("limits.max_in_flight", |c| &mut c.limits.max_in_flight),
        ("limits.append_queue", |c| &mut c.limits.append_queue),
        ("read_cache_stripes", |c| &mut c.read_cache_stripes),
    ];
    for (name, field) in counts {
        let mut c = ok.clone();
        *field(&mut c) = MAX_COUNT_LIMIT;
        assert!(c.validate().is_ok(), "{name}");
        *field(&mut c) = MAX_COUNT_LIMIT + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(&format!("{name} must be at most")), "{e}");
    }
    // The widths sum without overflowing on the way to the refusal.
    let mut c = ok.clone();
    c.data_shards = usize::MAX;
    assert!(c.validate().is_err());
}

/// Each of the geometry's and the limits' lower bounds holds exactly
/// at its edge: the edge is taken, one step past it is refused with a
/// message naming the field.
#[test]
fn the_lower_bounds_hold_exactly_at_their_edges() {
    let zones = |n: usize| (0..n).map(|z| PathBuf::from(format!("z{z}"))).collect();
    let ok = Config::with_zones(zones(3));
    let taken = |c: &Config, what: &str| {
        if let Err(e) = c.validate() {
            panic!("{what}: refused with {e}");
        }
    };
    taken(&ok, "the defaults");
    let refused = |c: &Config, says: &str| {
        let e = c.validate().expect_err(says).to_string();
        assert!(e.contains(says), "expected {says:?} in {e:?}");
    };
    type Edit = fn(&mut Config);
    // (field, the edge that is taken, one step past it, what the
    // refusal says)
    let edges: [(&str, Edit, Edit, &str); 12] = [
        (
            "data_shards",
            |c| c.data_shards = 1,
            |c| c.data_shards = 0,
            "data_shards and parity_shards must both be at least 1",
        ),
        (
            "parity_shards",
            |c| c.parity_shards = 1,
            |c| c.parity_shards = 0,
            "data_shards and parity_shards must both be at least 1",
        ),
        (
            "page_bytes",
            // Records of a small page's stripe: the 64 MiB default
            // needs more fragments than its root can list.
            |c| {
                c.page_bytes = 4096;
                c.max_record_bytes = 1 << 10;
            },
            |c| c.page_bytes = 4095,
            "page_bytes must be between 4096",
        ),
        (
            "page_bytes (top)",
            |c| c.page_bytes = MAX_PAGE_BYTES,
            |c| c.page_bytes = MAX_PAGE_BYTES + 1,
            "page_bytes must be between 4096",
        ),
        (
            "segment_bytes",
            |c| c.segment_bytes = 4 * c.page_bytes as u64,
            |c| c.segment_bytes = 4 * c.page_bytes as u64 - 1,
            "segment_bytes must hold at least four pages",
        ),
        // 3 end-write copies and two windows of 3 pages.
        (
            "max_segments",
            |c| c.max_segments = 10,
            |c| c.max_segments = 9,
            "max_segments must exceed the 9 segments",
        ),
        (
            "prepared_segments",
            |c| c.prepared_segments = MAX_PREPARED_SEGMENTS,
            |c| c.prepared_segments = MAX_PREPARED_SEGMENTS + 1,
            "prepared_segments must be at most",
        ),
        (
            "max_record_bytes",
            |c| c.max_record_bytes = 1,
            |c| c.max_record_bytes = 0,
            "max_record_bytes must be between 1",
        ),
        (
            "limits.max_frame_bytes",
            |c| c.limits.max_frame_bytes = 64,
            |c| c.limits.max_frame_bytes = 63,
            "limits.max_frame_bytes must be at least 64",
        ),
        (
            "limits.max_connections",
            |c| c.limits.max_connections = 1,
            |c| c.limits.max_connections = 0,
            "limits must be positive",
        ),
        (
            "limits.max_in_flight",
            |c| c.limits.max_in_flight = 1,
            |c| c.limits.max_in_flight = 0,
            "limits must be positive",
        ),
        (
            "limits.append_queue",
            |c| c.limits.append_queue = 1,
            |c| c.limits.append_queue = 0,
            "limits must be positive",
        ),
    ];
    for (field, edge, past, says) in edges {
        let mut c = ok.clone();
        edge(&mut c);
        taken(&c, field);
        past(&mut c);
        refused(&c, says);
    }
    // A page at its largest needs segments of four such pages.
    let mut c = ok.clone();
    c.page_bytes = MAX_PAGE_BYTES;
    c.segment_bytes = 4 * MAX_PAGE_BYTES as u64;
    taken(&c, "a largest page in segments of four");
    // As many zones as the stripe is wide, or as the three end-write
    // copies need when the stripe is narrower.
    let mut c = Config::with_zones(zones(2));
    refused(&c, "2 zones configured but a stripe of 3 pages");
    c.data_shards = 1;
    refused(&c, "need at least 3 zones");
    let mut c = Config::with_zones(zones(5));
    c.data_shards = 4;
    taken(&c, "5 zones for a stripe of 5 pages");
    c.data_shards = 5;
    refused(&c, "5 zones configured but a stripe of 6 pages");
    // The widest stripe, 255 pages, in as many zones; one page more
    // is refused for its width, not for its zones.
    let mut c = Config::with_zones(zones(256));
    c.data_shards = 254;
    c.max_segments = (END_WRITE_COPIES + 2 * 256) as u64 + 1;
    taken(&c, "a stripe of 255 pages in 256 zones");
    c.data_shards = 255;
    refused(&c, "data_shards + parity_shards must be at most 255");
}

#[test]
fn devices_need_one_per_zone_each_its_own_and_block_aligned_segments() {
    let mut c = Config::with_zones(vec!["a".into(), "b".into(), "c".into()]);
    c.devices = vec!["/dev/x".into(), "/dev/y".into(), "/dev/z".into()];
    assert!(c.validate().is_ok());
    for (devices, segment_bytes, says) in [
        (
            vec!["/dev/x", "/dev/y"],
            256 << 20,
            "2 devices configured for 3 zones",
        ),
        (
            vec!["/dev/x", "/dev/y", "/dev/x"],
            256 << 20,
            "appears twice",
        ),
        (
            vec!["/dev/x", "/dev/y", "/dev/z"],
            (256 << 20) + 512,
            "multiple of 4096",
        ),
    ] {
        c.devices = devices.into_iter().map(PathBuf::from).collect();
        c.segment_bytes = segment_bytes;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
}

/// A key that moved into `[tuning]` is refused at the top level with
/// where it went, and taken there; a removed key is refused, at
/// either level, with what to do instead.
#[test]
fn moved_and_removed_keys_are_refused_with_what_to_do() {
    let base = "zones = [\"a\", \"b\", \"c\"]\n";
    for key in MOVED_TO_TUNING {
        let value = match key {
            "direct_write_min_bytes" | "prepare_mib_s" | "writer_round_max_bytes" => "7",
            _ => "true",
        };
        let err = Config::from_toml(&format!("{base}{key} = {value}\n"))
            .expect_err(key)
            .to_string();
        assert!(
            err.contains(&format!("`{key}` moved to the [tuning] table")),
            "{err}"
        );
        let c = Config::from_toml(&format!("{base}[tuning]\n{key} = {value}\n"))
            .unwrap_or_else(|e| panic!("{key} under [tuning]: {e}"));
        let v = serde_json::to_value(&c.tuning).unwrap();
        assert_eq!(v[key].to_string(), value, "{key}");
    }
    for (key, instead) in REMOVED {
        for (text, named) in [
            (format!("{base}{key} = 1\n"), key.to_string()),
            (
                format!("{base}[tuning]\n{key} = 1\n"),
                format!("tuning.{key}"),
            ),
        ] {
            let err = Config::from_toml(&text).expect_err(key).to_string();
            assert!(
                err.contains(&format!("`{named}` is no longer an option: {instead}")),
                "{err}"
            );
        }
    }
    // Any other unknown key is still a parse error naming it.
    let err = Config::from_toml(&format!("{base}[tuning]\nfsync_harder = true\n"))
        .expect_err("unknown")
        .to_string();
    assert!(err.contains("fsync_harder"), "{err}");
}

/// Spares are on by default, within the bound the validation keeps.
#[test]
fn spares_are_on_by_default_and_process_settings_off() {
    let c = Config::with_zones(vec!["a".into(), "b".into(), "c".into()]);
    assert!(c.prepared_segments > 0 && c.prepared_segments <= MAX_PREPARED_SEGMENTS);
    assert!(!c.tuning.disable_transparent_huge_pages);
    let parsed = Config::from_toml("zones = [\"a\", \"b\", \"c\"]\n").unwrap();
    assert_eq!(parsed.prepared_segments, c.prepared_segments);
    assert!(!parsed.tuning.disable_transparent_huge_pages);
}
