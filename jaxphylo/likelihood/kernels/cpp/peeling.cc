// XLA FFI custom calls for the CPU: the whole post-order (Felsenstein) pass,
// and the whole pre-order pass with the cotangent contractions, on the arrays
// of jaxphylo's JAX kernels (see _peeling.py, _preorder.py and _kernel.py,
// which define the semantics reproduced here).
//
//   jaxphylo_post_order(transition [B,L,C,S,S], tip_codes [N+1,P] i32, tip_table [K,S],
//                       children [B,R,2] i32, root_row [B] i32, pi [B,S], w [B,C])
//     -> pattern_log_likelihoods [B,P], partials [B,R+1,C,P,S]
//   jaxphylo_pre_order_cotangents(the same seven, partials, g [B,P])
//     -> d_transition [B,L,C,S,S], d_pi [B,S], d_w [B,C], d_tips [N+1,P,S]
//   jaxphylo_log_likelihoods(the same seven) -> pattern_log_likelihoods [B,P] (no partials kept)
//   jaxphylo_cotangents(the same seven, g [B,P])
//     -> d_transition, d_pi, d_w, d_table [K,S] (partials recomputed per block in cache)
//
// float64 and float32 (every floating input of one call in one dtype).
//
// Layout ids: tip t < N, slot r is N + r, N + R the sentinel; a slot with
// both children N + R is padding. Only the partials rows of real slots are
// written (and read back by the pre-order pass): the sentinel row and padding
// rows of the `partials` output are left as they were. Rows are rescaled by
// their maximum over categories and states per pattern, as `_peeling.rescale`
// (times its reciprocal); the log scale factors are accumulated as a running
// product per pattern (one log every few hundred nodes, not one per node).
//
// Traversal order: the schedule's slots are in level order, but any order
// with children before parents is a post-order. We walk each tree depth
// first, the larger subtree first, so that a node's children were written
// recently (cache), and a post-order that keeps no partials needs a stack of
// at most log2(N) + 2 rows; the pre-order visits the smaller subtree first,
// which bounds its stack of pending q vectors the same way. Patterns are
// processed in blocks (every tree, every node, per block), and blocks are
// split over threads when the problem is big enough.
//
// Kernels: 4 states with at most 16 categories have a path with one state
// vector per SIMD register and the tips' messages looked up per code; other
// sizes use small matrix products on blocks of patterns. Both are compiled
// for the baseline x86-64 instruction set and again for AVX2 + FMA, chosen
// at run time. Settings (environment, read once): JAXPHYLO_CPU_THREADS (threads,
// default the CPU count, at most 8), JAXPHYLO_CPU_ISA=baseline (no AVX2),
// JAXPHYLO_BLOCK (patterns per block, for tuning).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxphylo {

constexpr int64_t kMaxC4 = 16;  // the 4-state fast path keeps every category of a pattern on the stack

inline int64_t padded_states(int64_t S) { return (S + 7) / 8 * 8; }

// Per-thread scratch buffers, by purpose id, grown on demand and kept (64-byte aligned).
// Ids: 0-5 a node's temporaries (messages, sums, maxima; 0-12, 16, 17 for any S);
// 13 the q stack; 14, 15 the scale sums; 18 the rows kept by the likelihood-only
// and fused passes. A function never takes the same id twice while using it.
constexpr int kScratchIds = 19;

inline unsigned char* scratch_bytes(int id, size_t bytes) {
  thread_local std::vector<unsigned char> buffers[kScratchIds];
  std::vector<unsigned char>& v = buffers[id];
  if (v.size() < bytes + 64) v.resize(bytes + 64);
  uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<unsigned char*>((p + 63) & ~uintptr_t(63));
}

template <typename X>
inline X* scratch(int id, int64_t n) {
  return reinterpret_cast<X*>(scratch_bytes(id, size_t(std::max<int64_t>(n, 1)) * sizeof(X)));
}

// Ask for transparent huge pages on a big output buffer before writing it (Linux; a hint only).
// XLA allocates outputs afresh on every call, so a buffer of hundreds of MB
// would otherwise cost one page fault per 4 KiB, more than the arithmetic.
inline void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t huge = uintptr_t(1) << 21;
  if (bytes < 4 * huge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + huge - 1) & ~(huge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(huge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// log of a product of per-pattern scale factors, kept as lsum + log(acc).
inline void add_scale(double m, double& acc, double& lsum) {
  if (m < 1e-100 || m > 1e100) {
    lsum += std::log(m);
    return;
  }
  double x = acc * m;
  if (x < 1e-150 || x > 1e150) {
    lsum += std::log(x);
    x = 1.0;
  }
  acc = x;
}

struct Visit {
  int32_t slot, q, qa, qb;  // q stack entries of the node and of its children (-1: a tip)
};

struct PostStep {
  int32_t slot, entry, entry_a, entry_b;  // row stack entries of the node and its children (-1: a tip)
};

struct Plan {
  std::vector<PostStep> post;   // real slots, children first (the root last)
  std::vector<Visit> pre;       // real slots, parents first (the root first)
  std::vector<int32_t> compact; // per slot: its index among real slots (-1: padding)
  int32_t depth = 1;            // q stack entries used by the pre-order
  int32_t post_depth = 1;       // row stack entries used by a post-order that keeps no partials
};

template <typename T>
struct Args {
  int64_t B, N, R, L, C, S, P, K;
  const T* transition;
  const int32_t* codes;
  const T* table;
  const int32_t* children;
  const int32_t* root_row;
  const T* pi;
  const T* w;
  T* loglik = nullptr;            // post-order outputs
  T* partials_out = nullptr;
  const T* partials = nullptr;    // pre-order inputs and outputs
  const T* g = nullptr;
  T* d_tips = nullptr;
  const std::vector<Plan>* plans = nullptr;
};

template <typename T>
struct Accum {  // what one chunk of patterns adds up over its patterns
  T* d_transition;
  double* d_pi;
  double* d_w;
  T* d_table;  // [K, S] when tips' cotangents go straight to the tip table, else null (d_tips)
};

// Patterns per block: big enough to amortise setting up each node (its
// matrices, what its tips send up), small enough for the rows in use to stay
// in cache. Fused gradient: every row of a tree for one block stays in
// scratch until the pre-order of that block, so that is kept near 8 MB.
enum class Pass { kKeep, kLikelihood, kFused };

template <typename T>
inline int64_t block_patterns(const Args<T>& a, Pass pass) {
  static const int64_t forced = std::getenv("JAXPHYLO_BLOCK") ? std::atoi(std::getenv("JAXPHYLO_BLOCK")) : 0;
  if (forced > 0) return forced;
  const bool four = a.S == 4 && a.C <= kMaxC4;
  int64_t bp = 128;
  if (!four) {
    const int64_t per = a.C * padded_states(a.S) * int64_t(sizeof(T));
    bp = std::max<int64_t>(8, std::min<int64_t>(512, (64 * 1024 / per) / 4 * 4));
  }
  if (pass == Pass::kFused) {  // every row of the block in scratch: up to about 8 MB (L3), at least 32 patterns
    const int64_t per = std::max<int64_t>(a.N - 1, 1) * a.C * a.S * int64_t(sizeof(T));
    bp = std::min(bp, std::max<int64_t>(32, (int64_t(8) << 20) / per / 8 * 8));
  }
  return bp;
}

// An incremental post-order's operation lists (`update_chunk`, jaxphylo_update_partials).
struct Update {
  int64_t M, I, Q;          // nodes, internal nodes (rows per buffer), operation list length
  const int32_t* buffer;    // [B, I]: the row (0/1) of every internal node read and written
  const int32_t* children;  // [B, M, 2]
  const int32_t* ops;       // [B, Q]
  const int32_t* counts;    // [B]
  const int32_t* root;      // [B]
};

// ---------------------------------------------------------------------------
// Kernels, compiled twice.
// ---------------------------------------------------------------------------

namespace base {
#include "kernels.inc"
}  // namespace base

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define JAXPHYLO_HAVE_AVX2 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
#include "kernels.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
#define JAXPHYLO_HAVE_AVX2 0
#endif

static bool use_avx2() {
#if JAXPHYLO_HAVE_AVX2
  static const bool yes = [] {
    const char* isa = std::getenv("JAXPHYLO_CPU_ISA");
    if (isa && std::strcmp(isa, "baseline") == 0) return false;
    __builtin_cpu_init();
    return bool(__builtin_cpu_supports("avx2")) && bool(__builtin_cpu_supports("fma"));
  }();
  return yes;
#else
  return false;
#endif
}

template <typename T>
static void run_post_chunk(const Args<T>& a, int64_t pb, int64_t pe, bool keep) {
#if JAXPHYLO_HAVE_AVX2
  if (use_avx2()) return avx2::post_chunk<T>(a, pb, pe, keep);
#endif
  base::post_chunk<T>(a, pb, pe, keep);
}

template <typename T>
static void run_pre_chunk(const Args<T>& a, int64_t pb, int64_t pe, const Accum<T>& out, bool recompute) {
#if JAXPHYLO_HAVE_AVX2
  if (use_avx2()) return avx2::pre_chunk<T>(a, pb, pe, out, recompute);
#endif
  base::pre_chunk<T>(a, pb, pe, out, recompute);
}

// ---------------------------------------------------------------------------
// Threads: a few persistent workers; the caller works too, so nothing waits
// on a worker that never comes. Chunks are fixed ranges of patterns whatever
// thread runs them, so results do not depend on scheduling.
// ---------------------------------------------------------------------------

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static destruction
    return *pool;
  }

  int threads() const { return threads_; }

  // Run fn(0), ..., fn(n - 1); an exception thrown by any is rethrown here once all are done.
  void run(int n, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (n <= 1 || threads_ <= 1 || !busy.owns_lock()) {  // another call is using the workers: run here
      for (int i = 0; i < n; ++i) fn(i);
      return;
    }
    start_workers();
    Job job;
    job.fn = &fn;
    job.n = n;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return job.finished.load() == n && active_ == 0; });
    job_ = nullptr;
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    const std::function<void(int)>* fn = nullptr;
    int n = 0;
    std::atomic<int> next{0};
    std::atomic<int> finished{0};
    std::mutex error_mutex;
    std::exception_ptr error;
  };

  Pool() {
    int n = int(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("JAXPHYLO_CPU_THREADS")) n = std::atoi(env);
    threads_ = std::max(1, std::min(n, 8));
  }

  void start_workers() {
    if (started_) return;
    started_ = true;
    for (int i = 1; i < threads_; ++i) std::thread([this] { loop(); }).detach();
  }

  void work(Job& job) {
    for (int i; (i = job.next.fetch_add(1)) < job.n;) {
      try {
        (*job.fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(job.error_mutex);
        if (!job.error) job.error = std::current_exception();
      }
      job.finished.fetch_add(1);
    }
  }

  void loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Job* job = job_;
      if (job == nullptr) continue;
      ++active_;
      lock.unlock();
      work(*job);
      lock.lock();
      --active_;
      done_.notify_all();
    }
  }

  int threads_ = 1;
  bool started_ = false;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;
};

// How many chunks of patterns: one per thread when the pass is big enough
// to repay waking a worker (a few tens of microseconds of work), each at least one block.
static int num_chunks(int64_t B, int64_t N, int64_t C, int64_t S, int64_t P, int64_t block) {
  const int threads = Pool::get().threads();
  const double work = double(B) * double(N) * double(C) * double(P) * double(S) * double(S);
  if (threads <= 1 || work < 1e6) return 1;
  const int64_t blocks = (P + block - 1) / block;
  return int(std::max<int64_t>(1, std::min<int64_t>(threads, blocks)));
}

// Chunk i of n: whole blocks of patterns.
static void chunk_range(int i, int n, int64_t P, int64_t block, int64_t& pb, int64_t& pe) {
  const int64_t blocks = (P + block - 1) / block;
  pb = std::min(P, (blocks * i / n) * block);
  pe = std::min(P, (blocks * (i + 1) / n) * block);
}

// ---------------------------------------------------------------------------
// Schedules: check them, and plan both traversals.
// ---------------------------------------------------------------------------

static std::string build_plan(const int32_t* children, int64_t N, int64_t R, int64_t root, Plan& plan) {
  const int64_t sentinel = N + R;
  if (root < 0 || root >= R) return "root_row is out of range";
  std::vector<int64_t> size(R, 0);  // tips below each real slot
  auto tips_below = [&](int64_t id) { return id < N ? int64_t(1) : size[id - N]; };
  for (int64_t r = 0; r < R; ++r) {
    const int64_t a = children[2 * r], b = children[2 * r + 1];
    if (a == sentinel && b == sentinel) continue;
    for (int64_t id : {a, b}) {
      if (id < 0 || id >= sentinel) return "a child id is out of range";
      if (id >= N && (id - N >= r || size[id - N] == 0))
        return "a slot's child is not an earlier real slot";
    }
    if (a == b) return "a slot has the same child twice";
    size[r] = tips_below(a) + tips_below(b);
  }
  if (size[root] == 0) return "the root slot is padding";
  if (size[root] != N) return "the root's subtree does not hold every tip once";

  plan.post.clear();
  plan.pre.clear();
  plan.compact.assign(R, -1);
  for (int64_t r = 0, n = 0; r < R; ++r)
    if (size[r] > 0) plan.compact[r] = int32_t(n++);
  plan.depth = plan.post_depth = 1;
  // Children of slot r: the smaller subtree first.
  auto small_large = [&](int64_t r, int64_t& small, int64_t& large) {
    const int64_t a = children[2 * r], b = children[2 * r + 1];
    const bool a_small = tips_below(a) <= tips_below(b);
    small = a_small ? a : b;
    large = a_small ? b : a;
  };
  // Post-order, the larger subtree first, rows on a stack: a node at entry t sends its larger
  // child to t (the node's row is then written over it, in place) and the smaller to t + 1.
  std::vector<char> seen(N, 0);
  struct Item { int64_t id; int32_t t; bool expanded; };
  std::vector<Item> stack{{N + root, 0, false}};
  while (!stack.empty()) {
    const Item item = stack.back();
    stack.pop_back();
    if (item.id < N) {
      if (seen[item.id]++) return "a tip occurs twice in a tree";
      continue;
    }
    const int64_t r = item.id - N;
    int64_t small, large;
    small_large(r, small, large);
    const int32_t t_large = item.t, t_small = large >= N ? item.t + 1 : item.t;
    if (item.expanded) {
      const int32_t e_small = small >= N ? t_small : -1, e_large = large >= N ? t_large : -1;
      const bool a_small = small == children[2 * r];
      plan.post.push_back({int32_t(r), item.t, a_small ? e_small : e_large, a_small ? e_large : e_small});
      plan.post_depth = std::max(plan.post_depth, std::max(e_small, e_large) + 1);
      continue;
    }
    stack.push_back({item.id, item.t, true});
    stack.push_back({small, t_small, false});
    stack.push_back({large, t_large, false});
  }
  // Pre-order: q_k in stack entry t; the larger child's q goes to t (in place), the smaller's to t + 1,
  // and the smaller subtree is visited first.
  std::vector<std::pair<int64_t, int32_t>> todo{{root, 0}};
  while (!todo.empty()) {
    auto [r, t] = todo.back();
    todo.pop_back();
    int64_t small, large;
    small_large(r, small, large);
    const bool a_small = small == children[2 * r];
    int32_t q_small = -1, q_large = -1;
    if (large >= N) q_large = t;
    if (small >= N) q_small = large >= N ? t + 1 : t;
    plan.depth = std::max(plan.depth, std::max(q_small, q_large) + 1);
    plan.pre.push_back({int32_t(r), t, a_small ? q_small : q_large, a_small ? q_large : q_small});
    if (large >= N) todo.push_back({large - N, q_large});
    if (small >= N) todo.push_back({small - N, q_small});
  }
  return "";
}

// ---------------------------------------------------------------------------
// Shapes.
// ---------------------------------------------------------------------------

struct Shape {
  int64_t B, N, R, L, C, S, P, K;
};

static bool dims_are(ffi::AnyBuffer::Dimensions d, std::initializer_list<int64_t> want) {
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t x : want)
    if (d[i++] != x) return false;
  return true;
}

static std::string read_shape(const ffi::AnyBuffer& transition, const ffi::Buffer<ffi::S32>& codes,
                              const ffi::AnyBuffer& table, const ffi::Buffer<ffi::S32>& children,
                              const ffi::Buffer<ffi::S32>& root_row, const ffi::AnyBuffer& pi,
                              const ffi::AnyBuffer& w, Shape& s) {
  auto t = transition.dimensions();
  if (t.size() != 5 || t[3] != t[4]) return "transition must be [B, L, C, S, S]";
  s.B = t[0]; s.L = t[1]; s.C = t[2]; s.S = t[3];
  auto c = codes.dimensions();
  if (c.size() != 2 || c[0] < 2) return "tip_codes must be [N + 1, P] with N >= 1";
  s.N = c[0] - 1; s.P = c[1];
  auto k = table.dimensions();
  if (k.size() != 2 || k[1] != s.S || k[0] < 1) return "tip_table must be [K, S]";
  s.K = k[0];
  auto ch = children.dimensions();
  if (ch.size() != 3 || ch[0] != s.B || ch[2] != 2) return "children must be [B, R, 2]";
  s.R = ch[1];
  if (s.L != s.N + s.R + 1) return "transition's second axis must be N + R + 1 layout ids";
  if (!dims_are(root_row.dimensions(), {s.B})) return "root_row must be [B]";
  if (!dims_are(pi.dimensions(), {s.B, s.S})) return "root frequencies must be [B, S]";
  if (!dims_are(w.dimensions(), {s.B, s.C})) return "category weights must be [B, C]";
  if (s.S < 1 || s.C < 1) return "need at least one state and one category";
  if (table.element_type() != transition.element_type() || pi.element_type() != transition.element_type() ||
      w.element_type() != transition.element_type())
    return "transition, tip_table, pi and w must share one dtype";
  return "";
}

static std::string make_plans(const Shape& s, const int32_t* children, const int32_t* root_row,
                              const int32_t* codes, std::vector<Plan>& plans) {
  plans.resize(s.B);
  for (int64_t b = 0; b < s.B; ++b) {
    std::string err = build_plan(children + b * s.R * 2, s.N, s.R, root_row[b], plans[b]);
    if (!err.empty()) return "tree " + std::to_string(b) + ": " + err;
  }
  int32_t lo = 0, hi = 0;
  const int64_t n = s.N * s.P;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, codes[i]);
    hi = std::max(hi, codes[i]);
  }
  if (lo < 0 || hi >= s.K) return "a tip code is outside the tip table";
  return "";
}

static ffi::Error bad(const std::string& what) { return ffi::Error::InvalidArgument("jaxphylo: " + what); }

// No C++ exception may cross the FFI boundary (out of memory for scratch, say).
template <typename F>
static ffi::Error guarded(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxphylo: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxphylo: unknown error");
  }
}

// ---------------------------------------------------------------------------
// Post-order: log L per pattern, with (keep) or without the partials buffer.
// ---------------------------------------------------------------------------

template <typename T>
static void post_order(Args<T>& a, bool keep) {
  const int64_t block = block_patterns(a, keep ? Pass::kKeep : Pass::kLikelihood);
  const int n = num_chunks(a.B, a.N, a.C, a.S, a.P, block);
  Pool::get().run(n, [&](int i) {
    int64_t pb, pe;
    chunk_range(i, n, a.P, block, pb, pe);
    if (pb < pe) run_post_chunk<T>(a, pb, pe, keep);
  });
}

static ffi::Error post_order_call(bool keep, ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes,
                                  ffi::AnyBuffer table, ffi::Buffer<ffi::S32> children,
                                  ffi::Buffer<ffi::S32> root_row, ffi::AnyBuffer pi, ffi::AnyBuffer w,
                                  ffi::Result<ffi::AnyBuffer> loglik, ffi::AnyBuffer* partials) {
  Shape s;
  std::string err = read_shape(transition, codes, table, children, root_row, pi, w, s);
  if (!err.empty()) return bad(err);
  if (!dims_are(loglik->dimensions(), {s.B, s.P}) || loglik->element_type() != transition.element_type())
    return bad("pattern log-likelihoods must be [B, P] in the inputs' dtype");
  if (keep && (!dims_are(partials->dimensions(), {s.B, s.R + 1, s.C, s.P, s.S}) ||
               partials->element_type() != transition.element_type()))
    return bad("partials must be [B, R + 1, C, P, S] in the inputs' dtype");
  if (s.B == 0 || s.P == 0) return ffi::Error::Success();
  std::vector<Plan> plans;
  err = make_plans(s, children.typed_data(), root_row.typed_data(), codes.typed_data(), plans);
  if (!err.empty()) return bad(err);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    Args<T> a{s.B, s.N, s.R, s.L, s.C, s.S, s.P, s.K, transition.typed_data<T>(), codes.typed_data(),
              table.typed_data<T>(), children.typed_data(), root_row.typed_data(), pi.typed_data<T>(),
              w.typed_data<T>()};
    a.loglik = loglik->typed_data<T>();
    if (keep) {
      a.partials_out = partials->typed_data<T>();
      advise_huge_pages(a.partials_out, partials->size_bytes());
    }
    a.plans = &plans;
    post_order<T>(a, keep);
  };
  switch (transition.element_type()) {
    case ffi::DataType::F64: run(double(0)); break;
    case ffi::DataType::F32: run(float(0)); break;
    default: return bad("only float64 and float32 are supported");
  }
  return ffi::Error::Success();
}

static ffi::Error PostOrderImpl(ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes, ffi::AnyBuffer table,
                                ffi::Buffer<ffi::S32> children, ffi::Buffer<ffi::S32> root_row, ffi::AnyBuffer pi,
                                ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> loglik,
                                ffi::Result<ffi::AnyBuffer> partials) {
  ffi::AnyBuffer out = *partials;
  return guarded([&] { return post_order_call(true, transition, codes, table, children, root_row, pi, w, loglik, &out); });
}

static ffi::Error LogLikelihoodsImpl(ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes, ffi::AnyBuffer table,
                                     ffi::Buffer<ffi::S32> children, ffi::Buffer<ffi::S32> root_row,
                                     ffi::AnyBuffer pi, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> loglik) {
  return guarded([&] { return post_order_call(false, transition, codes, table, children, root_row, pi, w, loglik, nullptr); });
}

// ---------------------------------------------------------------------------
// Pre-order with the cotangents, from stored partials or recomputing them.
// ---------------------------------------------------------------------------

// d_tips: [N + 1, P, S] per tip and pattern (stored partials), or, when `recompute`,
// d_table [K, S] directly (the fused call: what the custom VJP needs, without a big buffer).
template <typename T>
static void pre_order(Args<T>& a, bool recompute, T* d_transition, T* d_pi, T* d_w, T* d_tips) {
  const int64_t block = block_patterns(a, recompute ? Pass::kFused : Pass::kKeep);
  const int n = num_chunks(a.B, a.N, a.C, a.S, a.P, block);
  const int64_t nt = a.B * a.L * a.C * a.S * a.S, ntab = a.K * a.S;
  std::fill(d_transition, d_transition + nt, T(0));
  if (recompute) std::fill(d_tips, d_tips + ntab, T(0));
  // Chunk 0 adds into the outputs; the others into their own buffers, summed in chunk order.
  std::vector<std::vector<T>> extra(n - 1, std::vector<T>(nt + (recompute ? ntab : 0), T(0)));
  std::vector<double> roots(size_t(n) * a.B * (a.S + a.C), 0.0);
  std::vector<Accum<T>> acc(n);
  for (int i = 0; i < n; ++i) {
    double* r = roots.data() + size_t(i) * a.B * (a.S + a.C);
    T* dt = i == 0 ? d_transition : extra[i - 1].data();
    T* table = recompute ? (i == 0 ? d_tips : extra[i - 1].data() + nt) : nullptr;
    acc[i] = Accum<T>{dt, r, r + a.B * a.S, table};
  }
  Pool::get().run(n, [&](int i) {
    int64_t pb, pe;
    chunk_range(i, n, a.P, block, pb, pe);
    if (pb < pe) run_pre_chunk<T>(a, pb, pe, acc[i], recompute);
  });
  for (int i = 1; i < n; ++i) {
    for (int64_t x = 0; x < nt; ++x) d_transition[x] += extra[i - 1][x];
    if (recompute)
      for (int64_t x = 0; x < ntab; ++x) d_tips[x] += extra[i - 1][nt + x];
  }
  for (int64_t x = 0; x < a.B * a.S; ++x) {
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += acc[i].d_pi[x];
    d_pi[x] = T(sum);
  }
  for (int64_t x = 0; x < a.B * a.C; ++x) {
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += acc[i].d_w[x];
    d_w[x] = T(sum);
  }
  // The spare all-missing row of the tip cotangents is not a tip: zero.
  if (!recompute) std::fill(d_tips + a.N * a.P * a.S, d_tips + (a.N + 1) * a.P * a.S, T(0));
}

static ffi::Error pre_order_call(const ffi::AnyBuffer& transition, const ffi::Buffer<ffi::S32>& codes,
                                 const ffi::AnyBuffer& table, const ffi::Buffer<ffi::S32>& children,
                                 const ffi::Buffer<ffi::S32>& root_row, const ffi::AnyBuffer& pi,
                                 const ffi::AnyBuffer& w, const ffi::AnyBuffer* partials, const ffi::AnyBuffer& g,
                                 ffi::AnyBuffer d_transition, ffi::AnyBuffer d_pi, ffi::AnyBuffer d_w,
                                 ffi::AnyBuffer d_tips) {
  const bool recompute = partials == nullptr;
  Shape s;
  std::string err = read_shape(transition, codes, table, children, root_row, pi, w, s);
  if (!err.empty()) return bad(err);
  if (partials && !dims_are(partials->dimensions(), {s.B, s.R + 1, s.C, s.P, s.S}))
    return bad("partials must be [B, R + 1, C, P, S]");
  if (!dims_are(g.dimensions(), {s.B, s.P})) return bad("the pattern cotangent must be [B, P]");
  if (!dims_are(d_transition.dimensions(), {s.B, s.L, s.C, s.S, s.S}) ||
      !dims_are(d_pi.dimensions(), {s.B, s.S}) || !dims_are(d_w.dimensions(), {s.B, s.C}))
    return bad("outputs must be [B, L, C, S, S], [B, S], [B, C]");
  if (recompute ? !dims_are(d_tips.dimensions(), {s.K, s.S}) : !dims_are(d_tips.dimensions(), {s.N + 1, s.P, s.S}))
    return bad(recompute ? "the tip table's cotangent must be [K, S]" : "the tips' cotangent must be [N + 1, P, S]");
  const auto dtype = transition.element_type();
  for (auto t : {g.element_type(), d_transition.element_type(), d_pi.element_type(), d_w.element_type(),
                 d_tips.element_type()})
    if (t != dtype) return bad("every floating input and output must have one dtype");
  if (partials && partials->element_type() != dtype) return bad("every floating input must have one dtype");
  std::vector<Plan> plans;
  if (s.B > 0 && s.P > 0) {
    err = make_plans(s, children.typed_data(), root_row.typed_data(), codes.typed_data(), plans);
    if (!err.empty()) return bad(err);
  }
  auto run = [&](auto zero) {
    using T = decltype(zero);
    T* dt = d_transition.typed_data<T>();
    T* dp = d_pi.typed_data<T>();
    T* dw = d_w.typed_data<T>();
    T* tips = d_tips.typed_data<T>();
    if (s.B == 0 || s.P == 0) {
      std::fill(dt, dt + s.B * s.L * s.C * s.S * s.S, T(0));
      std::fill(dp, dp + s.B * s.S, T(0));
      std::fill(dw, dw + s.B * s.C, T(0));
      std::fill(tips, tips + d_tips.element_count(), T(0));
      return;
    }
    Args<T> a{s.B, s.N, s.R, s.L, s.C, s.S, s.P, s.K, transition.typed_data<T>(), codes.typed_data(),
              table.typed_data<T>(), children.typed_data(), root_row.typed_data(), pi.typed_data<T>(),
              w.typed_data<T>()};
    a.partials = partials ? partials->typed_data<T>() : nullptr;
    a.g = g.typed_data<T>();
    if (!recompute) {
      a.d_tips = tips;
      advise_huge_pages(tips, d_tips.size_bytes());
    }
    a.plans = &plans;
    pre_order<T>(a, recompute, dt, dp, dw, tips);
  };
  switch (dtype) {
    case ffi::DataType::F64: run(double(0)); break;
    case ffi::DataType::F32: run(float(0)); break;
    default: return bad("only float64 and float32 are supported");
  }
  return ffi::Error::Success();
}

static ffi::Error PreOrderImpl(ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes, ffi::AnyBuffer table,
                               ffi::Buffer<ffi::S32> children, ffi::Buffer<ffi::S32> root_row, ffi::AnyBuffer pi,
                               ffi::AnyBuffer w, ffi::AnyBuffer partials, ffi::AnyBuffer g,
                               ffi::Result<ffi::AnyBuffer> d_transition, ffi::Result<ffi::AnyBuffer> d_pi,
                               ffi::Result<ffi::AnyBuffer> d_w, ffi::Result<ffi::AnyBuffer> d_tips) {
  return guarded([&] {
    return pre_order_call(transition, codes, table, children, root_row, pi, w, &partials, g, *d_transition, *d_pi,
                          *d_w, *d_tips);
  });
}

static ffi::Error CotangentsImpl(ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes, ffi::AnyBuffer table,
                                 ffi::Buffer<ffi::S32> children, ffi::Buffer<ffi::S32> root_row, ffi::AnyBuffer pi,
                                 ffi::AnyBuffer w, ffi::AnyBuffer g, ffi::Result<ffi::AnyBuffer> d_transition,
                                 ffi::Result<ffi::AnyBuffer> d_pi, ffi::Result<ffi::AnyBuffer> d_w,
                                 ffi::Result<ffi::AnyBuffer> d_table) {
  return guarded([&] {
    return pre_order_call(transition, codes, table, children, root_row, pi, w, nullptr, g, *d_transition, *d_pi,
                          *d_w, *d_table);
  });
}


// ---------------------------------------------------------------------------
// Incremental post-order: an operation list per tree, partials kept by node id
// in two buffers (see _update.py for the semantics this reproduces).
// ---------------------------------------------------------------------------

template <typename T>
static void run_update_chunk(const Args<T>& a, const Update& u, T* partials, T* log_scales, int64_t pb, int64_t pe) {
#if JAXPHYLO_HAVE_AVX2
  if (use_avx2()) return avx2::update_chunk<T>(a, u, partials, log_scales, pb, pe);
#endif
  base::update_chunk<T>(a, u, partials, log_scales, pb, pe);
}

static std::string check_update(const Update& u, int64_t B, int64_t N) {
  for (int64_t x = 0; x < B * u.I; ++x)
    if (u.buffer[x] != 0 && u.buffer[x] != 1) return "buffer indices must be 0 or 1";
  for (int64_t b = 0; b < B; ++b) {
    if (u.counts[b] < 0 || u.counts[b] > u.Q) return "an operation count is out of range";
    if (u.root[b] < N || u.root[b] >= u.M) return "a root is not an internal node";
    for (int64_t k = 0; k < u.counts[b]; ++k) {
      const int64_t v = u.ops[b * u.Q + k];
      if (v < N || v >= u.M) return "an operation is not an internal node";
      for (int j = 0; j < 2; ++j) {
        const int64_t c = u.children[(b * u.M + v) * 2 + j];
        if (c < 0 || c >= u.M) return "a node in the operation list lacks two children";
      }
    }
  }
  return "";
}

static ffi::Error UpdateImpl(ffi::AnyBuffer transition, ffi::Buffer<ffi::S32> codes, ffi::AnyBuffer table,
                             ffi::AnyBuffer partials_in, ffi::AnyBuffer scales_in, ffi::Buffer<ffi::S32> buffer,
                             ffi::Buffer<ffi::S32> children, ffi::Buffer<ffi::S32> ops, ffi::Buffer<ffi::S32> counts,
                             ffi::Buffer<ffi::S32> root, ffi::AnyBuffer pi, ffi::AnyBuffer w,
                             ffi::Result<ffi::AnyBuffer> loglik, ffi::Result<ffi::AnyBuffer> partials,
                             ffi::Result<ffi::AnyBuffer> log_scales) {
  return guarded([&]() -> ffi::Error {
    auto t = transition.dimensions();
    if (t.size() != 5 || t[3] != t[4]) return bad("transition must be [B, M, C, S, S]");
    const int64_t B = t[0], M = t[1], C = t[2], S = t[3];
    auto cd = codes.dimensions();
    if (cd.size() != 2) return bad("tip_codes must be [N + 1, P]");
    const int64_t N = cd[0] - 1, P = cd[1], I = N - 1;
    auto k = table.dimensions();
    if (k.size() != 2 || k[1] != S) return bad("tip_table must be [K, S]");
    if (M != 2 * N - 1 || N < 2) return bad("transition must have M = 2N - 1 nodes");
    if (!dims_are(partials->dimensions(), {B, 2, I, C, P, S}) || !dims_are(partials_in.dimensions(), {B, 2, I, C, P, S}))
      return bad("partials must be [B, 2, N - 1, C, P, S]");
    if (!dims_are(log_scales->dimensions(), {B, 2, I, P}) || !dims_are(scales_in.dimensions(), {B, 2, I, P}))
      return bad("log scales must be [B, 2, N - 1, P]");
    if (!dims_are(buffer.dimensions(), {B, I}) || !dims_are(children.dimensions(), {B, M, 2}) ||
        ops.dimensions().size() != 2 || ops.dimensions()[0] != B || !dims_are(counts.dimensions(), {B}) ||
        !dims_are(root.dimensions(), {B}) || !dims_are(pi.dimensions(), {B, S}) || !dims_are(w.dimensions(), {B, C}) ||
        !dims_are(loglik->dimensions(), {B, P}))
      return bad("buffer [B, N - 1], children [B, M, 2], operations [B, Q], counts, root [B], pi [B, S], w [B, C]");
    const auto dtype = transition.element_type();
    for (auto e : {table.element_type(), partials->element_type(), log_scales->element_type(), pi.element_type(),
                   w.element_type(), loglik->element_type()})
      if (e != dtype) return bad("every floating input and output must have one dtype");
    if (partials->untyped_data() != partials_in.untyped_data() || log_scales->untyped_data() != scales_in.untyped_data())
      return bad("partials and log scales must be updated in place (aliased outputs)");
    Update u{M, I, ops.dimensions()[1], buffer.typed_data(), children.typed_data(), ops.typed_data(),
             counts.typed_data(), root.typed_data()};
    std::string err = check_update(u, B, N);
    if (!err.empty()) return bad(err);
    for (int64_t x = 0; x < N * P; ++x)
      if (codes.typed_data()[x] < 0 || codes.typed_data()[x] >= k[0]) return bad("a tip code is outside the tip table");
    if (B == 0 || P == 0) return ffi::Error::Success();
    int64_t work = 0;
    for (int64_t b = 0; b < B; ++b) work += counts.typed_data()[b] + 1;
    auto run = [&](auto zero) {
      using T = decltype(zero);
      Args<T> a{B, N, 0, M, C, S, P, k[0], transition.typed_data<T>(), codes.typed_data(), table.typed_data<T>(),
                nullptr, nullptr, pi.typed_data<T>(), w.typed_data<T>()};
      a.loglik = loglik->typed_data<T>();
      T* parts = partials->typed_data<T>();
      T* scales = log_scales->typed_data<T>();
      const int64_t block = block_patterns(a, Pass::kKeep);
      const int n = num_chunks(1, work, C, S, P, block);
      Pool::get().run(n, [&](int i) {
        int64_t pb, pe;
        chunk_range(i, n, P, block, pb, pe);
        if (pb < pe) run_update_chunk<T>(a, u, parts, scales, pb, pe);
      });
    };
    switch (dtype) {
      case ffi::DataType::F64: run(double(0)); break;
      case ffi::DataType::F32: run(float(0)); break;
      default: return bad("only float64 and float32 are supported");
    }
    return ffi::Error::Success();
  });
}

}  // namespace jaxphylo

#define JAXPHYLO_TREE_ARGS                 \
  .Arg<ffi::AnyBuffer>()        /* transition */ \
      .Arg<ffi::Buffer<ffi::S32>>() /* tip_codes */  \
      .Arg<ffi::AnyBuffer>()        /* tip_table */  \
      .Arg<ffi::Buffer<ffi::S32>>() /* children */   \
      .Arg<ffi::Buffer<ffi::S32>>() /* root_row */   \
      .Arg<ffi::AnyBuffer>()        /* pi */         \
      .Arg<ffi::AnyBuffer>()        /* w */

#pragma GCC visibility push(default)

// (transition, tip_codes, tip_table, children, root_row, pi, w) -> (log L [B, P], partials [B, R+1, C, P, S])
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxphylo_post_order, jaxphylo::PostOrderImpl,
                              ffi::Ffi::Bind() JAXPHYLO_TREE_ARGS.Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

// (the same seven) -> log L [B, P], keeping no partials
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxphylo_log_likelihoods, jaxphylo::LogLikelihoodsImpl,
                              ffi::Ffi::Bind() JAXPHYLO_TREE_ARGS.Ret<ffi::AnyBuffer>());

// (the seven, partials, g [B, P]) -> (d_transition, d_pi, d_w, d_tips [N+1, P, S])
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxphylo_pre_order_cotangents, jaxphylo::PreOrderImpl,
                              ffi::Ffi::Bind() JAXPHYLO_TREE_ARGS.Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// (the seven, g [B, P]) -> (d_transition, d_pi, d_w, d_table [K, S]): the post-order is recomputed
// block by block in scratch, and the tips' cotangents are summed into the tip table's
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxphylo_cotangents, jaxphylo::CotangentsImpl,
                              ffi::Ffi::Bind() JAXPHYLO_TREE_ARGS.Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// (transition [B,M,C,S,S], tip_codes, tip_table, partials [B,2,N-1,C,P,S], log_scales [B,2,N-1,P], buffer [B,N-1],
//  children [B,M,2], operations [B,Q], counts [B], root [B], pi, w) -> (log L [B, P], partials, log_scales), the
// last two aliased to the inputs and updated in place for the listed nodes only
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxphylo_update_partials, jaxphylo::UpdateImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

#pragma GCC visibility pop
