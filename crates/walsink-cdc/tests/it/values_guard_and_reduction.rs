//! What a column holds is what `jsonb_populate_record` makes of the event's image, the
//! position guard holds, and per-key reduction matches a one-by-one model
//! (docs/targets/cdc.md). Each test works in a schema of its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::{CdcSink, Config};

use crate::common::{admin, SHARED};

fn unique(tag: &str) -> String {
    crate::common::unique("probe", tag)
}

struct Lab {
    schema: String,
    admin: tokio_postgres::Client,
    sink: CdcSink,
    n: u64,
    dirs: Vec<tempfile::TempDir>,
}

impl Lab {
    async fn new(tag: &str, params: &str) -> Lab {
        let schema = unique(tag);
        let admin = admin().await;
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let sink = CdcSink::connect(
            Config::from_url(&format!("{SHARED}?schema={schema}{params}")).unwrap(),
        )
        .await
        .unwrap();
        Lab {
            schema,
            admin,
            sink,
            n: 0,
            dirs: Vec::new(),
        }
    }

    /// Applies `events` (raw JSON texts) as one epoch of a fresh log (its own sink id), so a
    /// failed case does not hold up the next.
    async fn apply(&mut self, events: &[String]) -> Result<(), String> {
        self.apply_epochs(&[events.to_vec()]).await
    }

    async fn apply_epochs(&mut self, epochs: &[Vec<String>]) -> Result<(), String> {
        self.n += 1;
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open_with(
            Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
            Options::new(format!("case{}", self.n)).read_chunk_size(64 << 10),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap();
        let wal = Arc::new(wal);
        self.dirs.push(dir);
        for (i, events) in epochs.iter().enumerate() {
            wal.append_batch(events.iter().map(|e| e.as_bytes()))
                .unwrap();
            wal.checkpoint(i as u64 + 1, b"m").unwrap();
            wal.checkpoint_complete(i as u64 + 1).unwrap();
        }
        walsink_tokio::deliver_ready(&wal, &mut self.sink)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn drop_schema(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}

fn ev(table: &str, op: &str, lsn: u64, before: &str, after: &str) -> String {
    format!(
        r#"{{"op":"{op}","before":{before},"after":{after},"ts_ms":0,"source":{{"db":"src","schema":"public","table":"{table}","lsn":{lsn}}}}}"#
    )
}

/// Column types and raw JSON values: what walsink stores must be what
/// `jsonb_populate_record` makes of the same image (the raw text, parsed by PostgreSQL), except
/// that a `json` or `jsonb` column takes a string as JSON text, as Debezium sends it; where
/// that raises an error, walsink must fail too (docs: "columns whose JSON form the column type
/// cannot read fail with the server's SQLSTATE (22xxx, permanent)"), never store something else.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn every_type_holds_what_jsonb_populate_record_makes() {
    let mut lab = Lab::new("types", "").await;
    let s = lab.schema.clone();
    lab.admin
        .batch_execute(&format!(
            "CREATE TYPE {s}.mood AS ENUM ('sad','ok'); CREATE DOMAIN {s}.posint AS int CHECK (VALUE > 0); \
             CREATE DOMAIN {s}.dtext AS text; CREATE DOMAIN {s}.djson AS jsonb; \
             CREATE TYPE {s}.pair AS (a int, b text); CREATE DOMAIN {s}.intarr AS int[];"
        ))
        .await
        .unwrap();
    let cases: Vec<(&str, &str)> = vec![
        ("numeric", "1.10"),
        ("numeric", "\"1.10\""),
        ("numeric", "3.14159265358979323846264338327950288"),
        ("numeric", "123456789012345678901234567890"),
        ("numeric", "1e3"),
        ("numeric", "-0"),
        ("numeric", "1E-7"),
        ("numeric(5,2)", "1.005"),
        ("numeric(5,2)", "\"999.999\""),
        ("integer", "1e3"),
        ("integer", "7"),
        ("integer", "\"7\""),
        ("integer", "7.0"),
        ("integer", "2147483648"),
        ("bigint", "9223372036854775807"),
        ("bigint", "-9223372036854775808"),
        ("bigint", "9223372036854775808"),
        ("smallint", "-32768"),
        ("double precision", "-0"),
        ("double precision", "0.1"),
        ("double precision", "1e308"),
        ("double precision", "\"NaN\""),
        ("double precision", "\"-Infinity\""),
        ("real", "3.4e38"),
        ("money", "\"$1,234.56\""),
        ("money", "12.345"),
        ("interval", "\"1 day 02:03:04.5\""),
        ("interval", "\"P1Y2M3DT4H5M6S\""),
        ("interval day to second(0)", "\"1 day 00:00:01.7\""),
        ("timestamptz", "\"2020-01-01T00:00:00+05:30\""),
        ("timestamp", "\"2020-01-01T00:00:00+05:30\""),
        ("timestamp(0)", "\"2020-01-01 00:00:00.6\""),
        ("time(0)", "\"12:34:56.789\""),
        ("timetz", "\"12:34:56+02\""),
        ("date", "\"infinity\""),
        ("bytea", "\"\\\\x00ff\""),
        ("bit(3)", "\"10101\""),
        ("bit(3)", "\"1\""),
        ("bit varying(3)", "\"10101\""),
        ("varchar(3)", "\"abcdef\""),
        ("varchar(3)", "\"ab   \""),
        ("char(3)", "\"abcdef\""),
        ("char(3)", "\"a\""),
        ("text", "\"é☃𝄞 \\\"quoted\\\" \\\\ back\""),
        ("text", "\"nul\\u0000byte\""),
        ("text", "12345678901234567890123"),
        ("text", "{\"b\":1.10,\"a\":[1e3]}"),
        ("text", "true"),
        ("uuid", "\"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11\""),
        ("uuid", "\"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}\""),
        ("inet", "\"10.0.0.1/8\""),
        ("cidr", "\"10.0.0.0/8\""),
        ("cidr", "\"10.0.0.1/8\""),
        ("macaddr", "\"08:00:2b:01:02:03\""),
        ("boolean", "\"yes\""),
        ("boolean", "1"),
        ("MOODTYPE", "\"ok\""),
        ("MOODTYPE", "\"happy\""),
        ("POSINT", "5"),
        ("POSINT", "-5"),
        ("DTEXT", "\"x\""),
        ("DJSON", "{\"a\":1.10,\"big\":12345678901234567890123}"),
        ("jsonb", "12345678901234567890123"),
        ("jsonb", "{\"x\":1.10}"),
        ("jsonb", "\"str\""),
        ("jsonb", "\"\\\"str\\\"\""),
        ("jsonb", "\"null\""),
        ("json", "\"[1, 2.50]\""),
        ("DJSON", "\"null\""),
        ("jsonb", "[1e3, -0, 0.1]"),
        ("json", "{\"b\":1,\"a\":2, \"a\":3}"),
        ("json", "1.10"),
        ("int4range", "\"[1,5)\""),
        ("numrange", "\"(1.10,2.5]\""),
        ("tstzrange", "\"[2020-01-01,2021-01-01)\""),
        ("int4multirange", "\"{[1,3),[5,7)}\""),
        ("point", "\"(1,2)\""),
        ("box", "\"(1,2),(3,4)\""),
        ("circle", "\"<(1,2),3>\""),
        ("line", "\"{1,2,3}\""),
        ("lseg", "\"[(1,2),(3,4)]\""),
        ("path", "\"((1,2),(3,4))\""),
        ("polygon", "\"((1,2),(3,4),(5,6))\""),
        ("xml", "\"<a>x</a>\""),
        ("tsvector", "\"a:1 b:2\""),
        ("tsquery", "\"a & b\""),
        ("integer[]", "[1,2,3]"),
        ("integer[]", "\"{1,2,3}\""),
        ("numeric[]", "[1.10, 3.14159265358979323846264338]"),
        ("text[]", "[\"a,b\", \"c\\\"d\", null]"),
        ("varchar(2)[]", "[\"abc\"]"),
        ("uuid[]", "[\"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11\"]"),
        ("jsonb[]", "[{\"a\":1}]"),
        ("PAIRTYPE", "{\"a\":1,\"b\":\"x\"}"),
        ("PAIRTYPE", "{\"a\":1e3,\"b\":\"x\"}"),
        ("INTARR", "[1,2]"),
    ];
    let mut mismatches = Vec::new();
    for (i, (ty, raw)) in cases.iter().enumerate() {
        let ty = ty
            .replace("MOODTYPE", &format!("{s}.mood"))
            .replace("POSINT", &format!("{s}.posint"))
            .replace("DTEXT", &format!("{s}.dtext"))
            .replace("DJSON", &format!("{s}.djson"))
            .replace("PAIRTYPE", &format!("{s}.pair"))
            .replace("INTARR", &format!("{s}.intarr"));
        let t = format!("c{i}");
        lab.admin
            .batch_execute(&format!(
                "CREATE TABLE {s}.{t} (id int PRIMARY KEY, c {ty})"
            ))
            .await
            .unwrap();
        let image = format!(r#"{{"id":1,"c":{raw}}}"#);
        // A json or jsonb column takes a string as JSON text, as Debezium sends it (docs:
        // targets/cdc.md); every other case is what jsonb_populate_record makes of the image.
        let json_text = match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(serde_json::Value::String(text))
                if matches!(ty.as_str(), "json" | "jsonb") || ty.ends_with(".djson") =>
            {
                Some(text)
            }
            _ => None,
        };
        let oracle = match &json_text {
            Some(text) => lab
                .admin
                .query_one(&format!("SELECT $1::text::jsonb::{ty}::text"), &[text])
                .await
                .map(|r| r.get::<_, Option<String>>(0)),
            None => lab
                .admin
                .query_one(
                    &format!(
                        "SELECT (jsonb_populate_record(NULL::{s}.{t}, $1::text::jsonb)).c::text"
                    ),
                    &[&image],
                )
                .await
                .map(|r| r.get::<_, Option<String>>(0)),
        }
        .map_err(|e| e.code().map(|c| c.code().to_string()).unwrap_or_default());
        let r = lab.apply(&[ev(&t, "c", 10, "null", &image)]).await;
        let got = match r {
            Ok(()) => {
                let rows = lab
                    .admin
                    .query(&format!("SELECT c::text FROM {s}.{t} WHERE id = 1"), &[])
                    .await
                    .unwrap();
                Ok(rows.first().map(|r| r.get::<_, Option<String>>(0)))
            }
            Err(e) => Err(e),
        };
        let ok = match (&oracle, &got) {
            (Ok(o), Ok(Some(g))) => o == g,
            (Err(_), Err(_)) => true,
            _ => false,
        };
        if !ok {
            mismatches.push(format!(
                "{ty} <- {raw}: jsonb_populate_record {:?}, walsink {:?}",
                oracle,
                got.map_err(|e| e.chars().take(160).collect::<String>())
            ));
        }
    }
    let n = cases.len();
    lab.drop_schema().await;
    assert!(
        mismatches.is_empty(),
        "{} of {n} cases differ from jsonb_populate_record:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// Column names with quotes, spaces and unicode; a case-sensitive table name; a generated
/// column the events do not carry; compound text keys with commas, parentheses and quotes;
/// deletes and key-changing updates of them, and replays of the old events afterwards.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn awkward_names_and_keys() {
    let mut lab = Lab::new("names", "").await;
    let s = lab.schema.clone();
    lab.admin
        .batch_execute(&format!(
            r#"CREATE TABLE {s}."Mixed Case" ("k ""1""" text, "ключ" int, "v al" text,
                 g int GENERATED ALWAYS AS ("ключ" * 2) STORED, PRIMARY KEY ("k ""1""", "ключ"))"#
        ))
        .await
        .unwrap();
    let key = |k: &str, n: i32| {
        format!(
            r#"{{"k \"1\"":{},"ключ":{n}}}"#,
            serde_json::to_string(k).unwrap()
        )
    };
    let img = |k: &str, n: i32, v: &str| {
        format!(
            r#"{{"k \"1\"":{},"ключ":{n},"v al":{}}}"#,
            serde_json::to_string(k).unwrap(),
            serde_json::to_string(v).unwrap()
        )
    };
    let t = "Mixed Case";
    let keys = [
        "a,b",
        "(x)",
        "q\"uote",
        "back\\slash",
        "",
        " lead",
        "ROW(1)",
        "{}",
    ];
    let mut first = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        first.push(ev(t, "c", 10 + i as u64, "null", &img(k, i as i32, "v1")));
    }
    // Delete the even ones, move the odd ones to a new key.
    let mut second = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let lsn = 100 + i as u64;
        if i % 2 == 0 {
            second.push(ev(t, "d", lsn, &key(k, i as i32), "null"));
        } else {
            second.push(ev(
                t,
                "u",
                lsn,
                &key(k, i as i32),
                &img(&format!("{k}!"), i as i32, "moved"),
            ));
        }
    }
    let r = lab.apply_epochs(&[first.clone(), second, first]).await;
    let rows = lab
        .admin
        .query(
            &format!(r#"SELECT "k ""1""", "ключ", "v al", g FROM {s}."Mixed Case" ORDER BY 2"#),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, i32, String, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    lab.drop_schema().await;
    r.expect("applies");
    let want: Vec<(String, i32, String, i32)> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(i, k)| (format!("{k}!"), i as i32, "moved".to_string(), 2 * i as i32))
        .collect();
    assert_eq!(got, want);
}

/// docs: "A delete leaves a tombstone … so a replayed older insert or update cannot bring the
/// row back", with "`k` is the key as PostgreSQL prints it after casting". A numeric key
/// written as "1.00" and deleted as "1.0" (the same key to PostgreSQL) must stay deleted when
/// the older insert is replayed.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_replayed_insert_of_a_numeric_key_stays_deleted() {
    let mut lab = Lab::new("numkey", "").await;
    let s = lab.schema.clone();
    lab.admin
        .batch_execute(&format!(
            "CREATE TABLE {s}.t (id numeric PRIMARY KEY, v text)"
        ))
        .await
        .unwrap();
    let ins = ev("t", "c", 10, "null", r#"{"id":"1.00","v":"a"}"#);
    let del = ev("t", "d", 20, r#"{"id":"1.0"}"#, "null");
    let r = lab
        .apply_epochs(&[vec![ins.clone()], vec![del], vec![ins]])
        .await;
    let n: i64 = lab
        .admin
        .query_one(&format!("SELECT count(*) FROM {s}.t"), &[])
        .await
        .unwrap()
        .get(0);
    lab.drop_schema().await;
    r.unwrap();
    assert_eq!(
        n, 0,
        "the deleted row came back from a replay of an older insert"
    );
}

/// One-by-one application: an insert with the key spelled in capitals, then an update of the
/// same uuid spelled in lower case, in one epoch. Applied one by one that is an insert and an
/// update of one row.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn one_key_spelled_two_ways_in_one_epoch() {
    let mut lab = Lab::new("uuidkey", "").await;
    let s = lab.schema.clone();
    lab.admin
        .batch_execute(&format!("CREATE TABLE {s}.t (id uuid PRIMARY KEY, v text)"))
        .await
        .unwrap();
    let r = lab
        .apply(&[
            ev(
                "t",
                "c",
                10,
                "null",
                r#"{"id":"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11","v":"old"}"#,
            ),
            ev(
                "t",
                "u",
                20,
                "null",
                r#"{"id":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","v":"new"}"#,
            ),
        ])
        .await;
    let rows: Vec<String> = lab
        .admin
        .query(&format!("SELECT v FROM {s}.t"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    lab.drop_schema().await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(rows, vec!["new".to_string()]);
}

/// add_missing_columns=true: "its type from the JSON value: bigint, double precision, boolean,
/// jsonb or text". A whole number above bigint's range must still land.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn added_columns_take_their_values() {
    let mut lab = Lab::new("addcol", "&add_missing_columns=true").await;
    let s = lab.schema.clone();
    lab.admin
        .batch_execute(&format!("CREATE TABLE {s}.t (id int PRIMARY KEY)"))
        .await
        .unwrap();
    let r = lab
        .apply(&[ev(
            "t",
            "c",
            10,
            "null",
            r#"{"id":1,"a b":true,"n":5,"f":1.5,"j":{"x":[1]},"s":"str","nul":null,"huge":18446744073709551615}"#,
        )])
        .await;
    let row = lab
        .admin
        .query(
            &format!(
                r#"SELECT "a b"::text, n::text, f::text, j::text, s, nul, huge::text FROM {s}.t"#
            ),
            &[],
        )
        .await;
    lab.drop_schema().await;
    r.expect("the event with new columns applies");
    let row = row.unwrap();
    let v: Vec<Option<String>> = (0..7).map(|i| row[0].get(i)).collect();
    assert_eq!(
        v,
        vec![
            Some("true".into()),
            Some("5".into()),
            Some("1.5".into()),
            Some("{\"x\": [1]}".into()),
            Some("str".into()),
            None,
            Some("18446744073709551615".into())
        ]
    );
}

/// Random histories (inserts, full-image updates, key-changing updates, deletes, truncates)
/// with old ranges replayed, in epochs much larger than max_held, against a one-by-one model
/// of the documented guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn random_histories_match_a_one_by_one_model() {
    for seed in 0..4u64 {
        let max_held = [1usize, 3, 7, 50][seed as usize];
        let mut lab = Lab::new("model", &format!("&max_held={max_held}")).await;
        let s = lab.schema.clone();
        lab.admin
            .batch_execute(&format!(
                "CREATE TABLE {s}.t (k text, n int, v text, PRIMARY KEY (k, n))"
            ))
            .await
            .unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
        let names = ["a", "a,b", "(c)", "d\"e", "f g", "", "h\\i", "1"];
        let mut lsn = 100u64;
        let mut history: Vec<(String, String)> = Vec::new(); // (event, op) in source order
        let mut live: BTreeMap<(String, i32), String> = BTreeMap::new();
        let kj = |k: &(String, i32)| {
            format!(
                r#"{{"k":{},"n":{}}}"#,
                serde_json::to_string(&k.0).unwrap(),
                k.1
            )
        };
        let ij = |k: &(String, i32), v: &str| {
            format!(
                r#"{{"k":{},"n":{},"v":{}}}"#,
                serde_json::to_string(&k.0).unwrap(),
                k.1,
                serde_json::to_string(v).unwrap()
            )
        };
        for _ in 0..3000 {
            lsn += rng.u64(1..3);
            let k = (names[rng.usize(0..names.len())].to_string(), rng.i32(0..6));
            let v = format!("v{lsn}");
            let e = match rng.u8(0..100) {
                0 => {
                    live.clear();
                    ev("t", "t", lsn, "null", "null")
                }
                1..=15 if live.contains_key(&k) => {
                    live.remove(&k);
                    ev("t", "d", lsn, &kj(&k), "null")
                }
                16..=30 if live.contains_key(&k) => {
                    let nk = (names[rng.usize(0..names.len())].to_string(), rng.i32(0..6));
                    if live.contains_key(&nk) {
                        continue;
                    }
                    live.remove(&k);
                    live.insert(nk.clone(), v.clone());
                    ev("t", "u", lsn, &kj(&k), &ij(&nk, &v))
                }
                _ => {
                    let op = if live.contains_key(&k) { "u" } else { "c" };
                    live.insert(k.clone(), v.clone());
                    ev("t", op, lsn, "null", &ij(&k, &v))
                }
            };
            history.push((e, String::new()));
        }
        // The stream: the history in order, with old ranges sent again now and then.
        let mut stream: Vec<String> = Vec::new();
        let mut i = 0;
        while i < history.len() {
            let n = rng.usize(1..200).min(history.len() - i);
            stream.extend(history[i..i + n].iter().map(|h| h.0.clone()));
            i += n;
            if rng.u8(0..3) == 0 {
                let from = rng.usize(0..i);
                let to = (from + rng.usize(1..300)).min(i);
                stream.extend(history[from..to].iter().map(|h| h.0.clone()));
            }
        }
        // The model of the documented guard, one event at a time.
        let model = model_apply(&stream);
        // Epochs of random sizes, much larger than max_held.
        let mut epochs = Vec::new();
        let mut j = 0;
        while j < stream.len() {
            let n = rng.usize(1..3000).min(stream.len() - j);
            epochs.push(stream[j..j + n].to_vec());
            j += n;
        }
        let r = lab.apply_epochs(&epochs).await;
        let rows = lab
            .admin
            .query(&format!("SELECT k, n, v FROM {s}.t"), &[])
            .await
            .unwrap();
        let got: BTreeMap<(String, i32), String> = rows
            .iter()
            .map(|r| ((r.get(0), r.get(1)), r.get(2)))
            .collect();
        lab.drop_schema().await;
        r.unwrap();
        assert_eq!(got.len(), model.len(), "seed {seed}: row count");
        assert!(
            got == model,
            "seed {seed}: rows differ from the one-by-one model"
        );
        assert_eq!(
            model, live,
            "seed {seed}: the model ends at the source's state"
        );
    }
}

fn model_apply(stream: &[String]) -> BTreeMap<(String, i32), String> {
    let mut rows: BTreeMap<(String, i32), (String, i64)> = BTreeMap::new();
    let mut tombs: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut wm = i64::MIN;
    let key = |v: &serde_json::Value| {
        (
            v["k"].as_str().unwrap().to_string(),
            v["n"].as_i64().unwrap() as i32,
        )
    };
    for e in stream {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        let rank = v["source"]["lsn"].as_i64().unwrap();
        let op = v["op"].as_str().unwrap();
        let mut delete = |k: (String, i32), rows: &mut BTreeMap<_, (String, i64)>| {
            if rank <= wm {
                return;
            }
            if rows.get(&k).is_some_and(|r: &(String, i64)| r.1 < rank) {
                rows.remove(&k);
            }
            let t = tombs.entry(k).or_insert(rank);
            *t = (*t).max(rank);
        };
        match op {
            "t" => {
                if rank > wm {
                    rows.retain(|_, r| r.1 >= rank);
                    tombs.retain(|_, p| *p >= rank);
                    wm = rank;
                }
            }
            "d" => delete(key(&v["before"]), &mut rows),
            _ => {
                let after = &v["after"];
                let k = key(after);
                if !v["before"].is_null() && key(&v["before"]) != k {
                    delete(key(&v["before"]), &mut rows);
                }
                if rank > wm
                    && rows.get(&k).is_none_or(|r| r.1 < rank)
                    && tombs.get(&k).is_none_or(|p| *p < rank)
                {
                    rows.insert(k, (after["v"].as_str().unwrap().to_string(), rank));
                }
            }
        }
    }
    rows.into_iter().map(|(k, (v, _))| (k, v)).collect()
}

/// A small xorshift generator (the crate has no random-number dev-dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn u64(&mut self, r: std::ops::Range<u64>) -> u64 {
        r.start + self.next() % (r.end - r.start)
    }
    fn usize(&mut self, r: std::ops::Range<usize>) -> usize {
        self.u64(r.start as u64..r.end as u64) as usize
    }
    fn i32(&mut self, r: std::ops::Range<i32>) -> i32 {
        r.start + self.u64(0..(r.end - r.start) as u64) as i32
    }
    fn u8(&mut self, r: std::ops::Range<u8>) -> u8 {
        self.u64(r.start as u64..r.end as u64) as u8
    }
}
