// Volumes read slab by slab (telar/io/volume.hpp): the generator is
// deterministic whatever the number of writers and makes lesions; each
// rank's slab and halos equal that region of the whole volume (even and
// uneven splits, 2-D splits, shuffled and unequal batches); the prefetch
// returns what a plain read does; bad files and slabs stop every rank with
// the same message.
#include <telar/data/loader.hpp>
#include <telar/io/volume.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

telar::Communicator world() {
  return telar::Communicator(MPI_COMM_WORLD, "world");
}

// A file name per test and world size (ctest may run np 1, 2, 4 at once).
std::string scratch(std::string const& tag) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return "telar_volume_" + tag + "_np" + std::to_string(n) + ".h5";
}

telar::SyntheticVolumeOptions small(long long depth, long long channels = 2) {
  telar::SyntheticVolumeOptions o;
  o.samples = 2, o.channels = channels, o.depth = depth, o.height = 8, o.width = 8;
  o.seed = 7;
  return o;
}

std::string bytes_of(std::string const& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The whole of samples 0 .. N-1, read by this rank alone.
telar::VolumeBatch whole(std::string const& path, telar::VolumeShape const& s) {
  telar::Communicator self(MPI_COMM_SELF, "self");
  telar::VolumeReader r(path, {{0, s.depth, 0, 0}, {}}, self);
  std::vector<std::size_t> all(std::size_t(s.samples));
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  telar::VolumeBatch b;
  r.read(all, b);
  return b;
}

// What f() throws, as the same text on every rank (checked), or "".
template <class F>
std::string error_everywhere(F&& f) {
  std::string msg;
  try {
    f();
  } catch (telar::DataError const& e) {
    msg = e.what();
  }
  auto const c = world();
  unsigned long long n = msg.size();
  c.broadcast(&n, 1, 0);
  std::string root = msg;
  root.resize(std::size_t(n));
  c.broadcast(root.data(), std::size_t(n), 0);
  REQUIRE(root == msg);
  return msg;
}

// Checks batch b, read with `slab`, against the whole volumes w.
void check_slab(telar::VolumeBatch const& b, telar::VolumeBatch const& w,
                telar::VolumeShape const& s, telar::VolumeSlab const& slab) {
  telar::SlabRange const d = slab.depth;
  telar::SlabRange const h = slab.height ? *slab.height : telar::SlabRange{0, s.height, 0, 0};
  REQUIRE(b.depth == d.read_size());
  REQUIRE(b.height == h.read_size());
  REQUIRE(b.label_depth == d.size());
  REQUIRE(b.images.size() == b.samples() * std::size_t(s.channels * b.depth * b.height * s.width));
  std::size_t bad = 0, i = 0, j = 0;
  for (std::size_t const idx : b.indices) {
    auto const n = (long long)idx;
    for (long long c = 0; c < s.channels; ++c)
      for (long long z = d.read_begin(); z < d.read_begin() + d.read_size(); ++z)
        for (long long y = h.read_begin(); y < h.read_begin() + h.read_size(); ++y)
          for (long long x = 0; x < s.width; ++x)
            bad += b.images[i++] !=
                   w.images[std::size_t(
                       (((n * s.channels + c) * s.depth + z) * s.height + y) * s.width + x)];
    for (long long z = d.begin; z < d.end; ++z)
      for (long long y = h.begin; y < h.end; ++y)
        for (long long x = 0; x < s.width; ++x)
          bad += b.labels[j++] !=
                 w.labels[std::size_t(((n * s.depth + z) * s.height + y) * s.width + x)];
  }
  CHECK(bad == 0);
}

// Writes volumes w of shape s to `path` in 1 x 1 x 4 x 4 x 4 chunks (rank 0 alone).
void write_chunked(std::string const& path, telar::VolumeShape const& s,
                   telar::VolumeBatch const& w) {
  using telar::detail::H5Handle;
  H5Handle f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  auto put = [&](char const* name, hid_t type, std::vector<hsize_t> const& dims, hid_t mem,
                 void const* data) {
    H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    std::vector<hsize_t> chunk(dims.size(), 1);
    for (std::size_t i = dims.size() - 3; i < dims.size(); ++i)
      chunk[i] = std::min<hsize_t>(4, dims[i]);
    H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
    H5Handle d(H5Dcreate2(f.get(), name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
               H5Dclose);
    REQUIRE(H5Dwrite(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    return d;
  };
  auto const n = hsize_t(s.samples), d = hsize_t(s.depth), h = hsize_t(s.height),
             x = hsize_t(s.width);
  put("images", H5T_IEEE_F32LE, {n, hsize_t(s.channels), d, h, x}, H5T_NATIVE_FLOAT,
      w.images.data());
  H5Handle l = put("labels", H5T_STD_U8LE, {n, d, h, x}, H5T_NATIVE_INT32, w.labels.data());
  telar::detail::h5_write_attr<long long>(l.get(), "classes", s.classes, path);
}

// Rank r asks for a different batch: shuffled, repeated, of 1 or 2 samples.
std::vector<std::size_t> batch_of(int rank) {
  return rank % 2 == 0 ? std::vector<std::size_t>{1, 0} : std::vector<std::size_t>{1};
}

} // namespace

TEST_CASE("Synthetic volumes are deterministic and hold lesions", "[volume]") {
  auto const c = world();
  std::string const a = scratch("gen_all"), one = scratch("gen_one"), other = scratch("gen_seed");
  telar::SyntheticVolumeOptions o = small(12);
  telar::write_synthetic_volumes(a, o, c);
  telar::Communicator self(MPI_COMM_SELF, "self");
  if (c.rank() == 0) {
    telar::write_synthetic_volumes(one, o, self); // rank 0 alone
    o.seed = 8;
    telar::write_synthetic_volumes(other, o, self);
    CHECK(bytes_of(a) == bytes_of(one));
    CHECK(bytes_of(a) != bytes_of(other));
  }
  c.barrier();
  auto const s = telar::read_volume_shape(a, c);
  CHECK((s.samples == 2 && s.channels == 2 && s.depth == 12 && s.height == 8 && s.width == 8));
  CHECK(s.classes == 2);
  telar::VolumeBatch const w = whole(a, s);
  long long const vox = s.depth * s.height * s.width;
  for (long long n = 0; n < s.samples; ++n) {
    double in = 0, out = 0, lesion = 0, min_in = 1e9, max_out = -1e9;
    for (long long v = 0; v < vox; ++v) {
      float const x = w.images[std::size_t(n * s.channels * vox + v)]; // channel 0
      bool const l = w.labels[std::size_t(n * vox + v)] == 1;
      (l ? in : out) += x;
      lesion += l;
      (l ? min_in : max_out) = l ? std::min(min_in, double(x)) : std::max(max_out, double(x));
    }
    double const frac = lesion / double(vox);
    INFO("sample " << n << ": lesion fraction " << frac);
    CHECK(frac > 0.0);
    CHECK(frac < 0.5);
    CHECK(in / lesion - out / (double(vox) - lesion) > 0.3); // brighter inside
    CHECK(max_out > min_in);                                 // no threshold separates them
  }
}

TEST_CASE("Each rank reads its slab and halos of the whole volume", "[volume]") {
  auto const c = world();
  for (long long depth : {12LL, 13LL}) { // 13: uneven over 2 and 4 ranks
    std::string const path = scratch("slab" + std::to_string(depth));
    telar::write_synthetic_volumes(path, small(depth), c);
    auto const s = telar::read_volume_shape(path, c);
    telar::VolumeBatch const w = whole(path, s);
    for (long long halo : {0LL, 2LL}) {
      INFO("depth " << depth << ", halo " << halo);
      telar::VolumeSlab const slab{telar::split_extent(depth, c.size(), c.rank(), halo), {}};
      CHECK(slab.depth.halo_lo == (c.rank() == 0 ? 0 : halo)); // no halo at the faces
      CHECK(slab.depth.halo_hi == (c.rank() + 1 == c.size() ? 0 : halo));
      telar::VolumeReader r(path, slab, c, {0, false}); // labels scanned in the last test case
      telar::VolumeBatch b;
      r.read(batch_of(c.rank()), b);
      check_slab(b, w, s, slab);
      CHECK(r.bytes_per_sample() ==
            std::size_t(s.channels * slab.depth.read_size() * s.height * s.width * 4 +
                        slab.depth.size() * s.height * s.width));
    }
  }
}

TEST_CASE("Depth and height split together (2-D decomposition)", "[volume]") {
  auto const c = world();
  std::string const path = scratch("grid");
  telar::write_synthetic_volumes(path, small(13), c);
  auto const s = telar::read_volume_shape(path, c);
  telar::VolumeBatch const w = whole(path, s);
  int const dp = c.size() >= 4 ? 2 : 1, hp = c.size() / dp; // 1x1, 1x2, 2x2
  telar::VolumeSlab slab{telar::split_extent(s.depth, dp, c.rank() / hp, 1),
                         telar::split_extent(s.height, hp, c.rank() % hp, 1, "height")};
  if (hp == 1)
    slab.height = telar::SlabRange{3, 6, 1, 2}; // an explicit inner range with halos
  telar::VolumeReader r(path, slab, c);
  telar::VolumeBatch b;
  r.read(batch_of(c.rank()), b);
  check_slab(b, w, s, slab);
  // The prefetch thread reads strided rows here.
  REQUIRE(r.prefetch_in_background());
  telar::VolumeBatch p;
  r.prefetch(batch_of(c.rank()));
  r.wait(p);
  CHECK(p.images == b.images);
  CHECK(p.labels == b.labels);
  // Independent MPI-IO reads the same.
  telar::VolumeReaderOptions independent;
  independent.collective = false;
  telar::VolumeReader ri(path, slab, c, independent);
  ri.read(batch_of(c.rank()), p);
  CHECK(p.images == b.images);
  CHECK(p.labels == b.labels);
}

TEST_CASE("Prefetching returns what a plain read does, batch after batch", "[volume]") {
  auto const c = world();
  std::string const path = scratch("prefetch");
  telar::SyntheticVolumeOptions o = small(12, 1);
  o.samples = 5;
  telar::write_synthetic_volumes(path, o, c);
  telar::VolumeSlab const slab{telar::split_extent(12, c.size(), c.rank(), 1), {}};
  telar::VolumeReader r(path, slab, c);
  REQUIRE(r.prefetch_in_background());        // contiguous float32 / uint8
  telar::BatchLoader loader({5, 1, 0, 3}, 2); // the project's seeded order
  telar::VolumeBatch plain, fetched;
  r.prefetch(loader.batch(0).indices);
  for (std::size_t step = 0; step < loader.size(); ++step) {
    r.wait(fetched);
    if (step + 1 < loader.size())
      r.prefetch(loader.batch(step + 1).indices);
    r.read(loader.batch(step).indices, plain); // collective while the thread reads
    CHECK(fetched.indices == loader.batch(step).indices);
    CHECK(fetched.images == plain.images);
    CHECK(fetched.labels == plain.labels);
  }
  CHECK_THROWS_AS(r.wait(fetched), std::logic_error);

  // A chunked copy: no pread thread; wait() reads collectively and agrees.
  std::string const chunked = scratch("chunked");
  if (c.rank() == 0) {
    telar::Communicator self(MPI_COMM_SELF, "self");
    auto const s = telar::read_volume_shape(path, self);
    telar::VolumeBatch const w = whole(path, s);
    write_chunked(chunked, s, w);
  }
  c.barrier();
  telar::VolumeReader rc(chunked, slab, c);
  CHECK_FALSE(rc.prefetch_in_background());
  for (std::size_t step = 0; step < loader.size(); ++step) {
    rc.prefetch(loader.batch(step).indices);
    rc.wait(fetched);
    r.read(loader.batch(step).indices, plain);
    CHECK(fetched.images == plain.images);
    CHECK(fetched.labels == plain.labels);
  }
}

TEST_CASE("Bad volume files and slabs stop every rank with one message", "[volume]") {
  auto const c = world();
  std::string const good = scratch("good");
  telar::write_synthetic_volumes(good, small(12), c);
  telar::VolumeSlab const slab{telar::split_extent(12, c.size(), c.rank(), 1), {}};
  // Rank 0 rewrites /labels of a copy.
  auto broken = [&](std::string const& tag, std::vector<hsize_t> const& dims, auto&& edit) {
    std::string const path = scratch(tag);
    if (c.rank() == 0) {
      std::filesystem::copy_file(good, path, std::filesystem::copy_options::overwrite_existing);
      telar::detail::H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      if (!dims.empty()) {
        H5Ldelete(f.get(), "labels", H5P_DEFAULT);
        telar::detail::create_dataset(f.get(), "labels", H5T_STD_U8LE, dims, path);
      }
      edit(f.get());
    }
    c.barrier();
    return path;
  };
  auto open = [&](std::string const& path, telar::VolumeSlab const& sl, int classes = 0) {
    return error_everywhere([&] { telar::VolumeReader(path, sl, c, {classes, true}); });
  };
  CHECK(open(good, slab).empty());

  std::string const p1 =
      broken("nolabels", {}, [](hid_t f) { H5Ldelete(f, "labels", H5P_DEFAULT); });
  CHECK(open(p1, slab) == "telar::VolumeReader: " + p1 +
                              ": no dataset /labels (a segmentation file holds /images [N, C, D, "
                              "H, W] and /labels [N, D, H, W])");
  std::string const p2 = broken("labelshape", {2, 12, 8, 9}, [](hid_t) {});
  CHECK(open(p2, slab) == "telar::VolumeReader: " + p2 +
                              ": /images [2, 2, 12, 8, 8] and /labels [2, 12, 8, 9] disagree: "
                              "/labels should be [2, 12, 8, 8]");
  std::string const p3 = broken("labelrank", {2, 12, 8}, [](hid_t) {});
  CHECK(open(p3, slab) == "telar::VolumeReader: " + p3 +
                              ": /images [2, 2, 12, 8, 8] and /labels [2, 12, 8] should have rank "
                              "5 [N, C, D, H, W] and rank 4 [N, D, H, W]");
  // Label 7 at sample 1, (d, h, w) = (3, 2, 1).
  std::string const p4 = broken("labelvalue", {}, [](hid_t f) {
    telar::detail::H5Handle d(H5Dopen2(f, "labels", H5P_DEFAULT), H5Dclose);
    telar::detail::H5Handle fs(H5Dget_space(d.get()), H5Sclose);
    hsize_t const at[4] = {1, 3, 2, 1}, one[4] = {1, 1, 1, 1};
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, at, nullptr, one, nullptr);
    telar::detail::H5Handle ms(H5Screate_simple(4, one, nullptr), H5Sclose);
    unsigned char const v = 7;
    H5Dwrite(d.get(), H5T_NATIVE_UCHAR, ms.get(), fs.get(), H5P_DEFAULT, &v);
  });
  CHECK(open(p4, slab) == "telar::VolumeReader: " + p4 +
                              ": /labels: sample 1 has label 7 at (d, h, w) = (3, 2, 1), outside "
                              "[0, 2)");
  CHECK(open(good, slab, 1).find("has label 1 at") != std::string::npos); // classes from the model

  // Slabs: empty on the last rank, past the lower face on rank 0.
  int const last = c.size() - 1;
  telar::VolumeSlab empty = slab;
  if (c.rank() == last)
    empty.depth = {12, 12, 0, 0};
  CHECK(open(good, empty) == "telar::VolumeReader: " + good + ": rank " + std::to_string(last) +
                                 ": depth slab [12, 12) is empty");
  telar::VolumeSlab low = slab;
  if (c.rank() == 0)
    low.depth.halo_lo = 1;
  CHECK(open(good, low).find(": rank 0: depth slab [0, ") != std::string::npos);
  CHECK(open(good, low).find("with halos 1 below") != std::string::npos);
  CHECK(error_everywhere([&] { telar::split_extent(12, 5, c.rank() % 5, 3); }) ==
        "telar::split_extent: depth 12 split into 5 slabs gives slabs of 2 planes, thinner than "
        "the halo of 3");
  CHECK(error_everywhere([&] { telar::split_extent(3, 4, c.rank() % 4, 0); }) ==
        "telar::split_extent: depth 3 split into 4 slabs: a slab would be empty");

  // A sample past the file on the last rank only; then the reader still works.
  telar::VolumeReader r(good, slab, c);
  telar::VolumeBatch b;
  std::vector<std::size_t> const idx =
      c.rank() == last ? std::vector<std::size_t>{0, 5} : std::vector<std::size_t>{0};
  std::string const past = "telar::VolumeReader: " + good + ": rank " + std::to_string(last) +
                           ": sample 5 is past the file's 2 samples";
  CHECK(error_everywhere([&] { r.read(idx, b); }) == past);
  r.prefetch(idx);
  CHECK(error_everywhere([&] { r.wait(b); }) == past);
  CHECK(error_everywhere([&] { r.read({1}, b); }).empty());
}
