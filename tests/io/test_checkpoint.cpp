// Checkpoints: saved under one layout and loaded under another, parameters,
// optimizer state and buffers (BatchNorm's running statistics) come back
// exactly; a resumed run equals the uninterrupted one (bitwise under the same
// layout); bad checkpoints give one clear CheckpointError on every rank.
#include "common.hpp"

#include <telar/io/checkpoint.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/losses.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>

#include <catch2/catch_test_macros.hpp>

#include <fcntl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace telar::test;
using Gathered = telar::GatheredModel<double>;

namespace {

// with(comm, layout, seed, f) calls f(trainer) with a fresh trainer of the
// common MLP (any ZeRO stage) ...
auto const with_mlp = [](MPI_Comm comm, Layout const& l, std::uint64_t seed, auto&& f) {
  with_trainer(comm, l, seed, f);
};

// ... or of a small CNN with BatchNorm on the same data (12 features as
// [3, 2, 2] images, 4 classes): Conv2D -> BatchNorm -> ReLU -> Flatten -> Dense.
using Cnn = telar::Sequential<telar::Conv2D<double>, telar::BatchNorm<double>, telar::ReLU<double>,
                              telar::Flatten<double>, telar::Dense<double>>;
auto const with_cnn = [](MPI_Comm comm, Layout const& l, std::uint64_t seed, auto&& f) {
  REQUIRE(l.zero == 0); // one Trainer type (compile time)
  auto opts = options_for(l, seed);
  if (l.pp == 2) // BatchNorm on the second stage: gathering to rank 0 moves its buffers
    opts.stage_boundaries = {0, 1, 5};
  telar::Trainer<Cnn, Plain, telar::Adam<double>> t(
      comm,
      Cnn(telar::Conv2D<double>(3, 4, 3, 1, 1), telar::BatchNorm<double>(4), {}, {},
          telar::Dense<double>(16, 4)),
      telar::Adam<double>{}, opts, telar::Shape{3, 2, 2});
  f(t);
};

// Saves after `steps` steps under layout a (gathering its state), loads
// into a fresh trainer of layout b (another seed) and gathers again; both on
// world rank 0.
struct Reshard {
  Gathered saved, loaded;
  double l2_a = 0, l2_b = 0; // after one more step each
  long long step_b = 0;
};
template <class With>
Reshard reshard(Layout const& a, Layout const& b, std::string const& dir, With const& with) {
  Reshard r;
  auto const data = make_data(batch * 4);
  {
    SubComm c(a.size());
    if (c.comm != MPI_COMM_NULL)
      with(c.comm, a, 7, [&](auto& t) {
        train_steps(t, data, 0, 2);
        telar::save_checkpoint(t, dir, {0, 2, 5});
        r.saved = telar::gather_model(t, 0, true);
        train_steps(t, data, 2, 3);
        r.l2_a = t.param_l2();
      });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    SubComm c(b.size());
    if (c.comm != MPI_COMM_NULL)
      with(c.comm, b, 1234, [&](auto& t) {
        auto const pos = telar::load_checkpoint(t, dir);
        CHECK(pos.batch == 2);
        CHECK(pos.seed == 5);
        r.step_b = t.steps();
        r.loaded = telar::gather_model(t, 0, true);
        train_steps(t, data, 2, 3);
        r.l2_b = t.param_l2();
      });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return r;
}

// Five steps straight, and two steps, save, load into a fresh trainer, three
// more: the gathered states on world rank 0.
struct Resume {
  Gathered straight, resumed;
};
template <class With>
Resume resume(Layout const& l, std::string const& dir, With const& with) {
  auto const data = make_data(batch * 5);
  SubComm c(l.size());
  Resume r;
  if (c.comm != MPI_COMM_NULL) {
    with(c.comm, l, 3, [&](auto& t) {
      train_steps(t, data, 0, 5);
      r.straight = telar::gather_model(t, 0, true);
    });
    with(c.comm, l, 3, [&](auto& t) {
      train_steps(t, data, 0, 2);
      telar::save_checkpoint(t, dir);
    });
    with(c.comm, l, 3, [&](auto& t) {
      telar::load_checkpoint(t, dir);
      train_steps(t, data, 2, 5);
      r.resumed = telar::gather_model(t, 0, true);
    });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return r;
}

} // namespace

TEST_CASE("A checkpoint loads under another layout with the same state", "[checkpoint]") {
  int const n = world_size();
  std::vector<std::pair<Layout, Layout>> pairs = {
      {{1, 1, 1}, {1, 1, 1, 3}},
      {{1, 1, 1}, {2, 1, 1}},
      {{2, 1, 1, 1}, {1, 1, 1}},
      {{2, 1, 1, 3}, {1, 2, 1}},
      {{1, 1, 2}, {2, 1, 1, 2}},
      {{1, 2, 1}, {1, 1, 2}},
      {{2, 2, 1}, {2, 1, 2}},
      {{4, 1, 1, 3}, {1, 2, 2, 1}},
      {{1, 2, 2, 0, "interleaved"}, {4, 1, 1, 1}},
  };
  for (auto const& [a, b] : pairs) {
    if (a.size() > n || b.size() > n)
      continue;
    std::string const dir = scratch_dir("reshard");
    Reshard const r = reshard(a, b, dir, with_mlp);
    if (world_rank() == 0) {
      INFO(a.str() << " -> " << b.str());
      CHECK(r.step_b == 2);
      REQUIRE(r.saved.tensors.size() == 3 * 6);   // parameters, m, v
      CHECK(r.loaded.tensors == r.saved.tensors); // parameters and Adam's m and v, exactly
      CHECK(r.loaded.shapes == r.saved.shapes);
      CHECK(rel_diff(r.l2_a, r.l2_b) <= 1e-11); // and training goes on alike
      std::filesystem::remove_all(dir);
    }
  }
}

TEST_CASE("Resuming from a checkpoint equals the uninterrupted run", "[checkpoint]") {
  int const n = world_size();
  std::vector<Layout> layouts = {{1, 1, 1}};
  if (n >= 2)
    layouts.insert(layouts.end(), {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 1, 1, 1}, {2, 1, 1, 3}});
  for (auto const& l : layouts) {
    std::string const dir = scratch_dir("resume");
    Resume const r = resume(l, dir, with_mlp);
    if (world_rank() == 0) {
      INFO(l.str());
      CHECK(r.resumed.tensors == r.straight.tensors); // bit for bit
      std::filesystem::remove_all(dir);
    }
  }
}

TEST_CASE("BatchNorm's running statistics reshard and resume with the checkpoint",
          "[checkpoint][batch_norm]") {
  int const n = world_size();
  std::vector<std::pair<Layout, Layout>> pairs = {{{1, 1, 1}, {1, 1, 1}}};
  if (n >= 2)
    pairs.insert(pairs.end(),
                 {{{1, 1, 1}, {2, 1, 1}}, {{2, 1, 1}, {1, 2, 1}}, {{1, 2, 1}, {1, 1, 1}}});
  if (n >= 4)
    pairs.push_back({{2, 2, 1}, {1, 1, 1}});
  for (auto const& [a, b] : pairs) {
    std::string const dir = scratch_dir("bn_reshard");
    Reshard const r = reshard(a, b, dir, with_cnn);
    if (world_rank() == 0) {
      INFO(a.str() << " -> " << b.str());
      CHECK(r.step_b == 2);
      REQUIRE(r.saved.tensors.count("buffers/layer1.running_mean") == 1);
      REQUIRE(r.saved.tensors.count("buffers/layer1.running_var") == 1);
      CHECK(r.saved.tensors.at("buffers/layer1.running_var") != std::vector<double>(4, 1.0));
      CHECK(r.saved.tensors.size() == 3 * 6 + 2); // parameters, m, v; the two buffers
      CHECK(r.loaded.tensors == r.saved.tensors); // buffers too, exactly
      CHECK(r.loaded.shapes == r.saved.shapes);
      // LocalStats normalises each rank's micro-batches: training goes on
      // alike only where the micro-batches are the same (the same dp).
      if (a.dp == b.dp)
        CHECK(rel_diff(r.l2_a, r.l2_b) <= 1e-11);
      std::filesystem::remove_all(dir);
    }
  }
  std::vector<Layout> layouts = {{1, 1, 1}};
  if (n >= 2)
    layouts.insert(layouts.end(), {{2, 1, 1}, {1, 2, 1}});
  for (auto const& l : layouts) {
    std::string const dir = scratch_dir("bn_resume");
    Resume const r = resume(l, dir, with_cnn);
    if (world_rank() == 0) {
      INFO(l.str());
      CHECK(r.resumed.tensors.count("buffers/layer1.running_var") == 1);
      CHECK(r.resumed.tensors == r.straight.tensors); // bit for bit, running statistics included
      std::filesystem::remove_all(dir);
    }
  }
}

namespace {
// A bf16 run: the common MLP in float, its GEMMs rebound to bf16 by the
// strategy (telar::Precision<bf16, float>); the same MLP in fp32 beside it.
using MlpF = telar::Sequential<telar::ColumnParallel<telar::Dense<float>>, telar::ReLU<float>,
                               telar::RowParallel<telar::Dense<float>>, telar::GELU<float>,
                               telar::Dense<float>>;
using Bf16 = telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>,
                             telar::TensorParallel<>, telar::Precision<telar::bf16, float>>;
struct FloatData {
  telar::Matrix<float> x;
  telar::Labels<> y;
};
FloatData float_data(std::size_t n) {
  Data const d = make_data(n);
  FloatData f{telar::Matrix<float>("x", n, 12), d.y};
  auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, d.x);
  auto hf = Kokkos::create_mirror_view(f.x);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < 12; ++j)
      hf(i, j) = float(hd(i, j));
  Kokkos::deep_copy(f.x, hf);
  return f;
}
template <class S, class F>
void with_float_mlp(MPI_Comm comm, Layout const& l, F&& f) {
  telar::Trainer<MlpF, S, telar::Adam<float>> t(
      comm,
      MlpF(telar::ColumnParallel<telar::Dense<float>>(12, 16), {},
           telar::RowParallel<telar::Dense<float>>(16, 9), {}, telar::Dense<float>(9, 4)),
      telar::Adam<float>{}, options_for(l, 3), 12);
  f(t);
}
// Whether some value needs more than bf16's 8 significant bits.
bool beyond_bf16(telar::GatheredModel<float> const& g) {
  for (auto const& [name, v] : g.tensors)
    for (float x : v) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      if ((bits & 0xffffu) != 0)
        return true;
    }
  return false;
}
} // namespace

// The checkpoint of a bf16 run holds the fp32 master weights and Adam's
// fp32 state (nothing rounded to bf16): resumed under bf16 the run ends bit
// for bit where the uninterrupted one does; loaded into an fp32 trainer the
// state is exactly the saved one and training goes on in fp32.
// A template on the memory space, so that where bf16 cannot compute (neither
// oneDNN in host memory nor cuBLAS in CUDA memory) its Trainer is never
// instantiated.
template <class M>
void bf16_checkpoint_case() {
  if constexpr (!telar::bf16_layers_supported<float, M>()) {
    SKIP("no bf16 layers in this memory space (neither oneDNN nor cuBLAS)");
  } else {
    if (!telar::bf16_available<M>())
      SKIP("no bf16 instructions here: bf16 is refused, not emulated");
    int const n = world_size();
    std::vector<Layout> layouts = {{1, 1, 1}};
    if (n >= 2)
      layouts.insert(layouts.end(), {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}});
    auto const data = float_data(batch * 5);
    for (auto const& l : layouts) {
      std::string const dir = scratch_dir("bf16");
      SubComm c(l.size());
      telar::GatheredModel<float> straight, saved, resumed, loaded_fp32, fp32_after;
      if (c.comm != MPI_COMM_NULL) {
        with_float_mlp<Bf16>(c.comm, l, [&](auto& t) {
          train_steps(t, data, 0, 5);
          straight = telar::gather_model(t, 0, true);
        });
        with_float_mlp<Bf16>(c.comm, l, [&](auto& t) {
          train_steps(t, data, 0, 2);
          telar::save_checkpoint(t, dir);
          saved = telar::gather_model(t, 0, true);
        });
        with_float_mlp<Bf16>(c.comm, l, [&](auto& t) {
          telar::load_checkpoint(t, dir);
          train_steps(t, data, 2, 5);
          resumed = telar::gather_model(t, 0, true);
        });
        with_float_mlp<Plain>(c.comm, l, [&](auto& t) {
          telar::load_checkpoint(t, dir);
          loaded_fp32 = telar::gather_model(t, 0, true);
          train_steps(t, data, 2, 5);
          fp32_after = telar::gather_model(t, 0, true);
        });
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) {
        INFO(l.str());
        REQUIRE(saved.tensors.size() == 3 * 6);       // parameters, m, v
        CHECK(beyond_bf16(saved));                    // fp32 masters, not bf16 copies
        CHECK(resumed.tensors == straight.tensors);   // bf16 resumed: bit for bit
        CHECK(loaded_fp32.tensors == saved.tensors);  // into fp32: exactly the saved state
        CHECK(fp32_after.tensors != resumed.tensors); // and then fp32 really ran
        // ... as close to the bf16 run as the bf16 GEMMs' error lets it be.
        double diff = 0, norm = 0;
        for (auto const& [name, v] : resumed.tensors)
          if (name.rfind("optim/", 0) != 0)
            for (std::size_t i = 0; i < v.size(); ++i) {
              double const d = double(v[i]) - double(fp32_after.tensors.at(name)[i]);
              diff += d * d;
              norm += double(v[i]) * double(v[i]);
            }
        CHECK(std::sqrt(diff / norm) <= 7.9e-3);
        std::filesystem::remove_all(dir);
      }
    }
  }
}

TEST_CASE("A bf16 run's checkpoint holds fp32 masters and resumes as bf16 or fp32",
          "[checkpoint][bf16]") {
  bf16_checkpoint_case<telar::DefaultMemorySpace>();
}

TEST_CASE("Checkpoints are kept, newest last, written atomically", "[checkpoint]") {
  auto const data = make_data(batch * 4);
  std::string const dir = scratch_dir("keep");
  Layout const l{world_size() >= 2 ? 2 : 1, 1, 1};
  SubComm c(l.size());
  if (c.comm != MPI_COMM_NULL)
    with_trainer(c.comm, l, 3, [&](auto& t) {
      for (int s = 0; s < 4; ++s) {
        train_steps(t, data, s, s + 1);
        auto const path = telar::save_checkpoint(t, dir, {}, {2});
        CHECK(path ==
              (std::filesystem::path(dir) / telar::detail::checkpoint_file_name(s + 1)).string());
      }
      CHECK(telar::latest_checkpoint(dir) ==
            (std::filesystem::path(dir) / "step-000004.h5").string());
      MPI_Barrier(c.comm);
      CHECK(telar::detail::list_checkpoints(dir).size() == 2);
      for (auto const& e : std::filesystem::directory_iterator(dir))
        CHECK(e.path().extension() != ".tmp");
    });
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_FALSE(telar::latest_checkpoint(dir + "/missing"));
  if (world_rank() == 0)
    std::filesystem::remove_all(dir);
}

namespace {
// The message every rank got, or "" when nothing was thrown.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (telar::CheckpointError const& e) {
    return e.what();
  }
  return {};
}
void require_same_everywhere(MPI_Comm comm, std::string const& msg) {
  unsigned long long len = msg.size(), max = 0, min = 0;
  MPI_Allreduce(&len, &max, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  MPI_Allreduce(&len, &min, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  CHECK(max == min);
}
} // namespace

TEST_CASE("Bad checkpoints raise one clear CheckpointError on every rank", "[checkpoint]") {
  auto const data = make_data(batch * 2);
  std::string const dir = scratch_dir("bad");
  Layout const l{1, 1, world_size() >= 2 ? 2 : 1};
  SubComm c(l.size());
  if (c.comm == MPI_COMM_NULL) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  std::string file;
  with_trainer(c.comm, l, 3, [&](auto& t) {
    train_steps(t, data, 0, 1);
    file = telar::save_checkpoint(t, dir);
  });
  int rank = 0;
  MPI_Comm_rank(c.comm, &rank);
  auto load = [&](std::string const& path) {
    std::string msg;
    with_trainer(c.comm, l, 3, [&](auto& t) {
      msg = error_of([&] { telar::load_checkpoint(t, path); });
      CHECK(t.steps() == (msg.empty() ? 1 : 0)); // untouched on failure
    });
    require_same_everywhere(c.comm, msg);
    return msg;
  };
  CHECK(load(file).empty());
  CHECK(load(dir + "/nowhere").find("does not exist") != std::string::npos);
  std::string const empty = dir + "/empty";
  if (rank == 0)
    std::filesystem::create_directories(empty);
  MPI_Barrier(c.comm);
  CHECK(load(empty).find("no complete checkpoint") != std::string::npos);

  // One flipped byte inside /params/layer0.weight.
  std::string const flipped = dir + "/flipped.h5";
  if (rank == 0) {
    std::filesystem::copy_file(file, flipped);
    haddr_t offset = HADDR_UNDEF;
    {
      hid_t f = H5Fopen(flipped.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      hid_t d = H5Dopen2(f, "/params/layer0.weight", H5P_DEFAULT);
      offset = H5Dget_offset(d);
      H5Dclose(d);
      H5Fclose(f);
    }
    std::fstream io(flipped, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(offset + 13));
    char ch = 0;
    io.read(&ch, 1);
    ch = char(ch ^ 0x10);
    io.seekp(std::streamoff(offset + 13));
    io.write(&ch, 1);
  }
  MPI_Barrier(c.comm);
  std::string const bad = load(flipped);
  CHECK(bad.find("flipped.h5") != std::string::npos);
  CHECK(bad.find("/params/layer0.weight [16, 12] fails its checksum") != std::string::npos);

  // Truncated to half its size.
  std::string const cut = dir + "/cut.h5";
  if (rank == 0) {
    std::filesystem::copy_file(file, cut);
    std::filesystem::resize_file(cut, std::filesystem::file_size(file) / 2);
  }
  MPI_Barrier(c.comm);
  std::string const truncated = load(cut);
  CHECK(truncated.find("cut.h5") != std::string::npos);
  CHECK_FALSE(truncated.empty());

  // Another model: a hidden layer of 10 instead of 16.
  {
    std::string msg;
    telar::Trainer<Mlp, Plain, telar::Adam<double>> t(c.comm, make_mlp(10), telar::Adam<double>{},
                                                      options_for(l, 3), 12);
    msg = error_of([&] { telar::load_checkpoint(t, file); });
    require_same_everywhere(c.comm, msg);
    CHECK(msg.find("tensor layer0.weight is [16, 12] in the file but [10, 12] in the model") !=
          std::string::npos);
  }
  // Another model: names differ (a model with one Dense less).
  {
    using Small = telar::Sequential<telar::ColumnParallel<telar::Dense<double>>,
                                    telar::ReLU<double>, telar::RowParallel<telar::Dense<double>>>;
    telar::Trainer<Small, Plain, telar::Adam<double>> t(
        c.comm,
        Small(telar::ColumnParallel<telar::Dense<double>>(12, 16), {},
              telar::RowParallel<telar::Dense<double>>(16, 9)),
        telar::Adam<double>{}, options_for(l, 3), 12);
    std::string const msg = error_of([&] { telar::load_checkpoint(t, file); });
    require_same_everywhere(c.comm, msg);
    CHECK(msg.find("the file's tensor layer4.weight [4, 9] is not in the model") !=
          std::string::npos);
  }
  // Another optimizer.
  {
    telar::SGD<double> sgd;
    sgd.momentum = 0.9;
    telar::Trainer<Mlp, Plain, telar::SGD<double>> t(c.comm, make_mlp(), sgd, options_for(l, 3),
                                                     12);
    std::string const msg = error_of([&] { telar::load_checkpoint(t, file); });
    require_same_everywhere(c.comm, msg);
    CHECK(msg.find("written with optimizer 'adam'") != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::filesystem::remove_all(dir);
}

TEST_CASE("A checkpoint without buffers does not load into a model with buffers",
          "[checkpoint][batch_norm]") {
  auto const data = make_data(batch * 2);
  std::string const dir = scratch_dir("nobuf");
  Layout const l{world_size() >= 2 ? 2 : 1, 1, 1};
  SubComm c(l.size());
  if (c.comm == MPI_COMM_NULL) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  std::string file;
  with_cnn(c.comm, l, 3, [&](auto& t) {
    train_steps(t, data, 0, 1);
    file = telar::save_checkpoint(t, dir);
  });
  int rank = 0;
  MPI_Comm_rank(c.comm, &rank);
  // What a checkpoint of the same parameters written before buffers existed
  // looks like: no /buffers at all, or one of them gone.
  for (char const* link : {"/buffers", "/buffers/layer1.running_var"}) {
    INFO("without " << link);
    std::string const stripped = dir + "/stripped.h5";
    if (rank == 0) {
      std::filesystem::copy_file(file, stripped, std::filesystem::copy_options::overwrite_existing);
      hid_t f = H5Fopen(stripped.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      CHECK(H5Ldelete(f, link, H5P_DEFAULT) >= 0);
      H5Fclose(f);
    }
    MPI_Barrier(c.comm);
    std::string msg;
    with_cnn(c.comm, l, 3, [&](auto& t) {
      msg = error_of([&] { telar::load_checkpoint(t, stripped); });
      CHECK(t.steps() == 0); // untouched
    });
    require_same_everywhere(c.comm, msg);
    std::string const missing = std::string(link) == "/buffers" ? "/buffers/layer1.running_mean"
                                                                : "/buffers/layer1.running_var";
    CHECK(msg.find("stripped.h5") != std::string::npos);
    CHECK(msg.find("buffer " + missing + ": missing") != std::string::npos);
    MPI_Barrier(c.comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::filesystem::remove_all(dir);
}

// A GPT with head-parallel attention and dropout: the query, key and value
// weights are split by rows, proj by columns; dropout resumes by step.
namespace {
std::size_t const vocab = 11, seq = 6, hidden = 8, heads = 4;
using Block = telar::TensorParallelTransformerBlock<double>;
using Gpt = telar::Sequential<telar::Embedding<double>, telar::PositionalEmbedding<double>,
                              telar::Dropout<double>, Block, telar::LayerNorm<double>,
                              telar::Dense<double>>;
using GptLoss = telar::PositionwiseCrossEntropy<double>;

Gpt make_gpt() {
  return Gpt(telar::Embedding<double>(vocab, hidden),
             telar::PositionalEmbedding<double>(seq, hidden), telar::Dropout<double>(0.1),
             telar::make_tensor_parallel_transformer_block<double>(hidden, heads),
             telar::LayerNorm<double>(hidden), telar::Dense<double>(hidden, vocab));
}

template <class F>
void with_gpt(MPI_Comm comm, Layout const& l, std::uint64_t seed, F&& f) {
  auto run = [&](auto tag) {
    telar::Trainer<Gpt, decltype(tag), telar::Adam<double>, GptLoss> t(
        comm, make_gpt(), telar::Adam<double>{}, options_for(l, seed), telar::Shape{seq});
    f(t);
  };
  if (l.zero == 3)
    run(ZeroStrategy<3>{});
  else
    run(Plain{});
}

template <class Tr>
void gpt_steps(Tr& t, int first, int last) {
  std::size_t const local = batch / std::size_t(t.grid_shape().dp);
  std::size_t const d = std::size_t(t.grid_coords().dp);
  telar::Matrix<double> x("x", local, seq);
  GptLoss::target_type y("y", local, seq);
  for (int s = first; s < last; ++s) {
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t i = 0; i < local; ++i) {
      std::size_t const g = std::size_t(s) * batch + d * local + i;
      std::size_t tok = (g * 5 + 3) % vocab;
      for (std::size_t p = 0; p < seq; ++p) {
        hx(i, p) = double(tok);
        tok = (tok * 3 + g % 4 + 1) % vocab;
        hy(i, p) = p + 1 < seq ? int(tok) : -100;
      }
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    t.step(x, y);
  }
}
} // namespace

TEST_CASE("A transformer checkpoint reshards across head-parallel layouts", "[checkpoint]") {
  int const n = world_size();
  std::vector<std::pair<Layout, Layout>> pairs = {{{1, 1, 1}, {1, 1, 1}}};
  if (n >= 2)
    pairs.insert(pairs.end(), {{{1, 1, 1}, {1, 1, 2}}, {{1, 1, 2}, {2, 1, 1, 3}}});
  if (n >= 4)
    pairs.push_back({{1, 2, 2}, {1, 1, 4}});
  for (auto const& [a, b] : pairs) {
    std::string const dir = scratch_dir("gpt");
    Gathered saved, loaded;
    double l2_a = 0, l2_b = 0;
    {
      SubComm c(a.size());
      if (c.comm != MPI_COMM_NULL)
        with_gpt(c.comm, a, 7, [&](auto& t) {
          gpt_steps(t, 0, 2);
          telar::save_checkpoint(t, dir);
          saved = telar::gather_model(t, 0, true);
          gpt_steps(t, 2, 3);
          l2_a = t.param_l2();
        });
    }
    MPI_Barrier(MPI_COMM_WORLD);
    {
      SubComm c(b.size());
      if (c.comm != MPI_COMM_NULL)
        with_gpt(c.comm, b, 7, [&](auto& t) {
          telar::load_checkpoint(t, dir);
          loaded = telar::gather_model(t, 0, true);
          gpt_steps(t, 2, 3);
          l2_b = t.param_l2();
        });
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      INFO(a.str() << " -> " << b.str());
      CHECK(saved.tensors.count("layer3.0.1.query.weight") == 1);
      CHECK(loaded.tensors == saved.tensors);
      CHECK(rel_diff(l2_a, l2_b) <= 1e-11);
      std::filesystem::remove_all(dir);
    }
  }
}

TEST_CASE("A checkpoint directory is locked by one run at a time", "[checkpoint]") {
  std::string const dir = scratch_dir("lock");
  if (world_rank() == 0) { // flock: a second open file in the same process conflicts too
    std::string refused;
    {
      telar::CheckpointLock const first(dir);
      CHECK(first.held());
      CHECK(first.warning().empty());
      try {
        telar::CheckpointLock const second(dir);
      } catch (telar::CheckpointError const& e) {
        refused = e.what();
      }
    }
    INFO(refused);
    CHECK(refused.find("telar::CheckpointLock: checkpoint directory " + dir +
                       " is in use by another run (host ") != std::string::npos);
    CHECK(refused.find(", pid " + std::to_string(::getpid()) + ")") != std::string::npos);
    telar::CheckpointLock const again(dir); // released with the first
    CHECK(again.held());
    std::filesystem::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("A checkpoint keeps the caller's run description", "[checkpoint]") {
  auto const data = make_data(batch);
  std::string const dir = scratch_dir("config");
  Layout const l{world_size() >= 2 ? 2 : 1, 1, 1};
  SubComm c(l.size());
  if (c.comm != MPI_COMM_NULL)
    with_trainer(c.comm, l, 3, [&](auto& t) {
      train_steps(t, data, 0, 1);
      telar::save_checkpoint(t, dir, {0, 1, 7, "--seed 7 --batch 24"});
      auto const pos = telar::load_checkpoint(t, dir);
      CHECK(pos.seed == 7);
      CHECK(pos.config == "--seed 7 --batch 24");
    });
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::filesystem::remove_all(dir);
}

namespace {
// A tmpfs of `kib` KiB mounted on `dir` while it lives (root only: mounted()
// is false elsewhere, the same on every rank).
struct TinyDisk {
  std::string dir;
  bool ok = false;
  TinyDisk(std::string d, int kib) : dir(std::move(d)) {
    int mounted = 0;
    if (world_rank() == 0)
      mounted = std::system(("mount -t tmpfs -o size=" + std::to_string(kib) + "k tmpfs " + dir +
                             " 2>/dev/null")
                                .c_str()) == 0;
    MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
    ok = mounted != 0;
  }
  ~TinyDisk() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() != 0)
      return;
    if (ok && std::system(("umount " + dir).c_str()) != 0)
      std::fprintf(stderr, "could not unmount %s\n", dir.c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// The metadata room save_checkpoint reserves for trainer t's checkpoint
// (collective).
template <class Trainer>
long long headroom_of(Trainer& t) {
  using View = telar::detail::TrainerView;
  auto const m = View::pieces(t);
  return telar::detail::metadata_headroom(m.names.size() * (1 + std::size_t(m.state_size)) +
                                              View::buffers(t).size(),
                                          telar::detail::signature(m).size());
}

// Fills the tmpfs at dir with dir/filler until about `left` bytes are free.
inline void leave_free(std::string const& dir, long long left) {
  long long const fill = telar::detail::free_bytes(dir) - left;
  int const fd = ::open((dir + "/filler").c_str(), O_CREAT | O_WRONLY, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::posix_fallocate(fd, 0, off_t(fill)) == 0);
  ::close(fd);
}
} // namespace

// The MLP's tensors with Adam state are 9.6 KB: an 8 KiB disk is refused
// before writing; on a 12 KiB one the tensors fit but the room reserved for
// HDF5's metadata does not, so it is refused before HDF5 opens the file.
// With the metadata's room and 4 KiB more free, HDF5 creates the file and
// allocating its blocks fails: the file must still close (parallel HDF5 1.10
// crashes at MPI_Finalize on a file whose close failed; space_reserve.hpp).
// Each says so and leaves no file behind.
TEST_CASE("A full disk is named as such and leaves no temporary file", "[checkpoint]") {
  auto const data = make_data(batch);
  for (int kib : {8, 12, 1024}) {
    std::string const disk_dir = scratch_dir("full" + std::to_string(kib));
    TinyDisk const disk(disk_dir, kib);
    if (!disk.ok) {
      WARN("not root (no tmpfs mount): the full-disk case is not run");
      return;
    }
    std::string const dir = disk_dir + "/ckpt";
    Layout const l{world_size() >= 2 ? 2 : 1, 1, 1};
    SubComm c(l.size());
    if (c.comm != MPI_COMM_NULL)
      with_trainer(c.comm, l, 3, [&](auto& t) {
        train_steps(t, data, 0, 1);
        long long const headroom = headroom_of(t); // collective
        if (kib == 1024 && world_rank() == 0)
          leave_free(disk_dir, headroom + 4096);
        MPI_Barrier(c.comm);
        std::string const msg = error_of([&] { telar::save_checkpoint(t, dir); });
        INFO(kib << " KiB: " << msg);
        CHECK(msg.rfind("telar::save_checkpoint: no space left on " + dir + " (needs about ", 0) ==
              0);
        require_same_everywhere(c.comm, msg);
        MPI_Barrier(c.comm);
        CHECK(std::distance(std::filesystem::directory_iterator(dir),
                            std::filesystem::directory_iterator{}) == 0);
      });
  }
}
