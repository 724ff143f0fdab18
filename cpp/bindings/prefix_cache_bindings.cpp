// Binds the prefix cache's parts: PrefixHasher (block hashes) and BlockPool (ref counts, the free
// queue, the hash -> block map).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <string>

#include "corellm/block_pool.h"
#include "corellm/prefix_hash.h"
#include "glue.h"

namespace corellm::binding {
namespace {

py::bytes hash_bytes(const BlockHash& h) {
  return py::bytes(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
}

BlockHash hash_from_bytes(const py::bytes& b) {
  std::string s = b;
  CORELLM_CHECK_ARG(s.size() == 32, "a block hash is 32 bytes, got ", s.size());
  BlockHash h;
  std::memcpy(h.bytes.data(), s.data(), 32);
  return h;
}

}  // namespace

void bind_prefix_cache(py::module_& m) {
  py::class_<PrefixHasher, std::shared_ptr<PrefixHasher>>(m, "PrefixHasher")
      .def(py::init<>())
      .def(py::init([](const py::bytes& root) { return std::make_shared<PrefixHasher>(hash_from_bytes(root)); }),
           py::arg("root"))
      .def_property_readonly("root", [](const PrefixHasher& h) { return hash_bytes(h.root()); })
      .def("hash_block",
           [](const PrefixHasher& h, const py::bytes& parent, const py::object& tokens, const std::string& extra) {
             auto ids = to_int32_vector(tokens, "token_ids", std::numeric_limits<int32_t>::min());
             return hash_bytes(h.hash_block(hash_from_bytes(parent), ids.data(), ids.size(), extra));
           },
           py::arg("parent"), py::arg("token_ids"), py::arg("extra_keys") = "");


  py::class_<BlockPool>(m, "BlockPool")
      .def(py::init<int32_t, bool>(), py::arg("num_blocks"), py::arg("enable_caching") = true)
      .def_property_readonly("num_blocks", &BlockPool::num_blocks)
      .def_property_readonly("num_free_blocks", &BlockPool::num_free_blocks)
      .def_property_readonly("usage", &BlockPool::usage)
      .def("get_new_blocks",
           [](BlockPool& p, int32_t n) -> py::object {
             CORELLM_CHECK_ARG(n >= 0, "n must be >= 0, got ", n);
             std::vector<int32_t> out;
             if (!p.get_new_blocks(n, out)) return py::none();
             return py::cast(out);
           },
           py::arg("n"), "n fresh blocks (ref count 1), or None when fewer are free")
      .def("touch", [](BlockPool& p, const py::object& ids) {
             auto v = to_int32_vector(ids, "block_ids", 0);
             for (int32_t id : v) p.block(id);  // range check
             p.touch(v.data(), v.size()); })
      .def("free_blocks", [](BlockPool& p, const py::object& ids) {
             auto v = to_int32_vector(ids, "block_ids", 0);
             for (int32_t id : v) CORELLM_CHECK_ARG(p.block(id).ref_cnt > 0, "block ", id, " is not in use");
             p.free_blocks(v.data(), v.size()); })
      .def("cache_block", [](BlockPool& p, int32_t id, const py::bytes& h) {
             CORELLM_CHECK_ARG(p.block(id).ref_cnt > 0, "block ", id, " is not in use");
             p.cache_block(id, hash_from_bytes(h)); })
      .def("get_cached_block", [](const BlockPool& p, const py::bytes& h) { return p.get_cached_block(hash_from_bytes(h)); })
      .def("ref_cnt", [](const BlockPool& p, int32_t id) { return p.block(id).ref_cnt; })
      .def("reset_prefix_cache", &BlockPool::reset_prefix_cache)
      .def("check_integrity", [](const BlockPool& p) { p.check_integrity({}); });
}

}  // namespace corellm::binding
