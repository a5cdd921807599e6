//! Lock/unlock on the in-memory backend: the cost of baton's own machinery, with no
//! network. `cargo bench --bench memory`.

use std::hint::black_box;

use baton::{MemoryBackend, Mutex, Session};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn uncontended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mutex, _session) = rt.block_on(async {
        let session = Session::new(MemoryBackend::new()).await.unwrap();
        (Mutex::new(&session, "bench").unwrap(), session)
    });
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(1));
    group.bench_function("uncontended lock+unlock", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = mutex.lock().await.unwrap();
            black_box(guard.fencing_token());
            guard.release().await.unwrap();
        });
    });
    group.finish();
}

fn contended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = MemoryBackend::new();
    let mutexes: Vec<Mutex> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..8 {
            let s = Session::new(backend.clone()).await.unwrap();
            v.push(Mutex::new(&s, "bench-contended").unwrap());
        }
        v
    });
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(8 * 16));
    group.bench_function("8 contenders x 16 cycles", |b| {
        b.to_async(&rt).iter(|| async {
            let tasks: Vec<_> = mutexes
                .iter()
                .cloned()
                .map(|m| {
                    tokio::spawn(async move {
                        for _ in 0..16 {
                            m.lock().await.unwrap().release().await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    });
    group.finish();
}

criterion_group!(benches, uncontended, contended);
criterion_main!(benches);
