// gateway::linear_rows in C++: packed_linear.py's `product` (x @ w^T for a few rows, fp32 on
// the CPU) without Python on each call. packed_linear.py says what the two forms are and why;
// native.py builds and loads this file, and falls back to the Python op where it cannot.
//
// Why: a compiled step calls the op once a product, 49 times a step of the demo target, and
// the Python op's body (its dispatch back into Python, the pack lookup, the checks) cost
// 10-14 us a call, 0.5-0.7 ms of a several-token step. Same kernels, same arguments: a
// product here is bitwise the Python op's.
//
// Packs: one per weight, keyed by (data pointer, sizes, strides, dtype), with a weak
// reference to the weight's TensorImpl; a pack serves a weight with its key while that
// TensorImpl lives and still has the key (a layer re-pointed at other memory, as `Joined`
// does, gets a pack of its own). Stale packs are swept before each new pack (a load); a
// weight whose layer went back to torch's forward has its pack dropped by `forget_packs`.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/mm.h>
#include <ATen/core/List.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace {

using Key = std::array<int64_t, 6>;  // data pointer, 2 sizes, 2 strides, dtype
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct Pack {
  WeakImpl source;
  at::Tensor packed;
};

std::mutex lock;  // the inference thread multiplies while a loader thread may pack
std::map<Key, Pack> packs;
int64_t rows_min = 4;  // set by packed_linear.py (`configure_packs`): its ROWS_MIN
bool onednn = true;    // packed_linear.AVAILABLE
int64_t made = 0;

Key key_of(const at::TensorImpl& w) {
  return {reinterpret_cast<int64_t>(w.data()), w.size(0), w.size(1), w.stride(0), w.stride(1),
          static_cast<int64_t>(c10::typeMetaToScalarType(w.dtype()))};
}

bool stale(const Key& key, const Pack& pack) {
  auto source = pack.source.lock();
  return !source || key_of(*source) != key;
}

at::Tensor reorder(const at::Tensor& w) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                       .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  return op.call(w.contiguous(), std::nullopt);
}

at::Tensor packed(const at::Tensor& w) {
  Key key = key_of(*w.unsafeGetTensorImpl());
  std::lock_guard<std::mutex> guard(lock);
  auto hit = packs.find(key);
  if (hit != packs.end() && !stale(key, hit->second)) return hit->second.packed;
  for (auto it = packs.begin(); it != packs.end();)  // a load: drop what can never serve
    it = stale(it->first, it->second) ? packs.erase(it) : std::next(it);
  at::Tensor pack = reorder(w.detach());
  packs.insert_or_assign(key, Pack{WeakImpl(w.getIntrusivePtr()), pack});
  ++made;
  return pack;
}

at::Tensor weight_major(const at::Tensor& x, const at::Tensor& w) {
  int64_t rows = x.size(0);
  at::Tensor cols = rows == 1 ? at::cat({x, x}) : x;
  return at::mm(w, cols.t()).slice(1, 0, rows).t().contiguous();
}

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w) {
  if (x.size(0) < rows_min || !onednn) return weight_major(x, w);
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<c10::Scalar>>,
                            std::optional<c10::string_view>)>();
  static const c10::List<std::optional<c10::Scalar>> none;
  return op.call(x.contiguous(), packed(w), std::nullopt, "none", none, "");
}

void configure_packs(int64_t least_rows, bool available) {
  std::lock_guard<std::mutex> guard(lock);
  rows_min = least_rows;
  onednn = available;
}

void forget_packs(at::TensorList weights) {
  std::lock_guard<std::mutex> guard(lock);
  for (auto it = packs.begin(); it != packs.end();) {
    auto source = it->second.source.lock();
    bool gone = source && std::any_of(weights.begin(), weights.end(), [&](const at::Tensor& w) {
                  return source.get() == w.unsafeGetTensorImpl();
                });
    it = gone ? packs.erase(it) : std::next(it);
  }
}

int64_t packs_made() {
  std::lock_guard<std::mutex> guard(lock);
  return made;
}

int64_t packs_kept() {
  std::lock_guard<std::mutex> guard(lock);
  return static_cast<int64_t>(packs.size());
}

bool has_pack(const at::Tensor& w) {
  Key key = key_of(*w.unsafeGetTensorImpl());
  std::lock_guard<std::mutex> guard(lock);
  auto hit = packs.find(key);
  return hit != packs.end() && !stale(key, hit->second);
}

}  // namespace

// packed_linear.py defines gateway::linear_rows (its schema and fake kernel): this library
// adds the CPU kernel and the packs' upkeep.
TORCH_LIBRARY_FRAGMENT(gateway, m) {
  m.def("configure_packs(int rows_min, bool available) -> ()", &configure_packs);
  m.def("forget_packs(Tensor[] weights) -> ()", &forget_packs);
  m.def("packs_made() -> int", &packs_made);
  m.def("packs_kept() -> int", &packs_kept);
  m.def("has_pack(Tensor w) -> bool", &has_pack);
}

TORCH_LIBRARY_IMPL(gateway, CPU, m) { m.impl("linear_rows", &linear_rows); }
