// telar_volumes: writes a synthetic 3-D segmentation data set
// (telar::write_synthetic_volumes) and reads it back slab by slab with
// telar::VolumeReader, splitting the depth over the ranks, timing each pass.
// docs/volumes.md. --corrupt breaks the written file on purpose (the error
// catalogue, docs/errors.md, runs the reader on such files).
#include <telar/data/loader.hpp>
#include <telar/io/volume.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args {
  std::string file, corrupt;
  telar::SyntheticVolumeOptions gen;
  bool generate = false, read = false, prefetch = true, collective = true;
  long long halo = 0, batch = 1, repeat = 1, work_ms = 0;
  int model_classes = 0;
};

long long integer(std::string const& flag, std::string const& v, long long lo) {
  std::size_t end = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &end);
  } catch (std::exception const&) {
    end = 0;
  }
  if (end == 0 || end != v.size() || x < lo)
    throw std::invalid_argument(flag + " expects an integer >= " + std::to_string(lo) + ", got '" +
                                v + "'");
  return x;
}

char const* const usage =
    "usage: telar_volumes --file F [--generate N] [--size DxHxW] [--channels C] [--classes K]\n"
    "                     [--lesions L] [--seed S] [--corrupt no-labels|label-shape|label-rank]\n"
    "                     [--read] [--halo H] [--batch B] [--repeat R] [--model-classes K]\n"
    "                     [--no-prefetch] [--independent] [--work-ms T]\n"
    "Writes a synthetic segmentation set (--generate, every rank writing its samples) and/or\n"
    "reads it with the depth split over the ranks, printing MB/s (--read). docs/volumes.md\n";

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string const f = argv[i];
    if (f == "--read" || f == "--no-prefetch" || f == "--independent") {
      (f == "--read" ? a.read : f == "--no-prefetch" ? a.prefetch : a.collective) = f == "--read";
      continue;
    }
    if (i + 1 >= argc)
      throw std::invalid_argument(f + " needs a value");
    kv[f] = argv[++i];
  }
  for (auto const& [f, v] : kv) {
    if (f == "--file")
      a.file = v;
    else if (f == "--generate")
      a.generate = true, a.gen.samples = integer(f, v, 1);
    else if (f == "--channels")
      a.gen.channels = integer(f, v, 1);
    else if (f == "--size") {
      long long d = 0, h = 0, w = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lldx%lldx%lld%c", &d, &h, &w, &tail) != 3 || d < 1 || h < 1 ||
          w < 1)
        throw std::invalid_argument("--size expects DxHxW (e.g. 128x128x128), got '" + v + "'");
      a.gen.depth = d, a.gen.height = h, a.gen.width = w;
    } else if (f == "--classes")
      a.gen.classes = int(integer(f, v, 2));
    else if (f == "--lesions")
      a.gen.max_lesions = int(integer(f, v, 1));
    else if (f == "--seed")
      a.gen.seed = std::uint64_t(integer(f, v, 0));
    else if (f == "--corrupt")
      a.corrupt = v;
    else if (f == "--halo")
      a.halo = integer(f, v, 0);
    else if (f == "--batch")
      a.batch = integer(f, v, 1);
    else if (f == "--work-ms")
      a.work_ms = integer(f, v, 0);
    else if (f == "--repeat")
      a.repeat = integer(f, v, 1);
    else if (f == "--model-classes")
      a.model_classes = int(integer(f, v, 1));
    else
      throw std::invalid_argument("unknown flag " + f);
  }
  if (a.file.empty())
    throw std::invalid_argument("--file is required");
  if (!a.corrupt.empty() && a.corrupt != "no-labels" && a.corrupt != "label-shape" &&
      a.corrupt != "label-rank")
    throw std::invalid_argument("--corrupt expects no-labels, label-shape or label-rank, got '" +
                                a.corrupt + "'");
  return a;
}

// Rank 0 replaces /labels by nothing or by a dataset of the wrong shape.
void corrupt(Args const& a) {
  telar::detail::H5Quiet quiet;
  telar::detail::H5Handle f(H5Fopen(a.file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0 || H5Ldelete(f.get(), "labels", H5P_DEFAULT) < 0)
    throw telar::DataError("telar_volumes: cannot corrupt " + a.file);
  auto const& g = a.gen;
  std::vector<hsize_t> dims = {hsize_t(g.samples), hsize_t(g.depth), hsize_t(g.height)};
  if (a.corrupt == "label-shape")
    dims.push_back(hsize_t(g.width + 1));
  if (a.corrupt != "no-labels")
    telar::detail::create_dataset(f.get(), "labels", H5T_STD_U8LE, dims, a.file);
}

// Reads every batch of one epoch, `repeat` times; rank 0 prints MB/s.
void read(Args const& a, telar::Communicator const& world) {
  telar::VolumeReaderOptions opts;
  opts.classes = a.model_classes;
  opts.collective = a.collective;
  telar::VolumeShape const shape = telar::read_volume_shape(a.file, world, a.model_classes);
  telar::VolumeSlab slab{telar::split_extent(shape.depth, world.size(), world.rank(), a.halo), {}};
  telar::VolumeReader reader(a.file, slab, world, opts);
  // Every rank reads the same samples (spatial parallelism: one replica).
  telar::BatchLoader loader({std::size_t(shape.samples), 1, 0, a.gen.seed}, std::size_t(a.batch));
  std::vector<double> rates, waits;
  telar::VolumeBatch b;
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  };
  for (long long r = 0; r < a.repeat; ++r) {
    world.barrier();
    auto const t0 = clock::now();
    double bytes = 0, wait = 0; // wait: seconds the loop waited for data
    if (a.prefetch && loader.size() > 0)
      reader.prefetch(loader.batch(0).indices);
    for (std::size_t s = 0; s < loader.size(); ++s) {
      auto const w0 = clock::now();
      if (a.prefetch) {
        reader.wait(b);
        if (s + 1 < loader.size())
          reader.prefetch(loader.batch(s + 1).indices);
      } else
        reader.read(loader.batch(s).indices, b);
      wait += since(w0);
      bytes += double(reader.bytes_per_sample() * b.samples());
      // Stands for a training step: --work-ms of sleep per step.
      std::this_thread::sleep_for(std::chrono::milliseconds(a.work_ms));
    }
    world.allreduce(&bytes, 1, telar::ReduceOp::sum);
    world.allreduce(&wait, 1, telar::ReduceOp::max);
    world.barrier();
    double const sec = since(t0);
    rates.push_back(bytes / sec / 1e6);
    waits.push_back(wait);
    if (world.rank() == 0)
      std::printf("pass %lld: %.1f MB in %.3f s (%.3f s waiting for data): %.1f MB/s\n", r,
                  bytes / 1e6, sec, wait, rates.back());
  }
  std::sort(rates.begin(), rates.end());
  std::sort(waits.begin(), waits.end());
  if (world.rank() == 0)
    std::printf("median %.1f MB/s, %.3f s waiting for data, over %zu passes, %d ranks, %s, %s\n",
                rates[rates.size() / 2], waits[waits.size() / 2], rates.size(), world.size(),
                a.prefetch ? "prefetch" : "plain read",
                a.collective ? "collective" : "independent");
}

// Generates (and breaks, with --corrupt) the file, then reads it.
void run(Args const& a, telar::Communicator const& world) {
  if (a.generate) {
    telar::write_synthetic_volumes(a.file, a.gen, world);
    if (!a.corrupt.empty())
      telar::detail::agreed_as<telar::DataError>(&world, "telar_volumes: --corrupt failed", [&] {
        if (world.rank() == 0)
          corrupt(a);
      });
  }
  if (a.read)
    read(a, world);
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    telar::Communicator world(MPI_COMM_WORLD, "world");
    try {
      if (argc < 2 || std::string(argv[1]) == "--help") {
        if (world.rank() == 0)
          std::fputs(usage, argc < 2 ? stderr : stdout);
        rc = argc < 2;
      } else {
        run(parse(argc, argv), world);
      }
    } catch (std::exception const& e) {
      std::string const m = e.what();
      if (world.rank() == 0)
        std::fprintf(stderr, "%s%s\n",
                     m.rfind("telar", 0) == 0 ? "" : "telar_volumes: ", m.c_str());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
