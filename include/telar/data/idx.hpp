#pragma once
/*! \file
 *  \brief Reader of IDX files (the format of MNIST and Fashion-MNIST), raw or
 *  gzip-compressed, and the Fashion-MNIST loader.
 *
 *  An IDX file is a 4-byte magic number `0x0000TTNN` (TT the element type,
 *  0x08 for unsigned bytes; NN the number of dimensions), NN big-endian 32-bit
 *  dimension sizes, then the elements in row-major order and nothing else.
 *  The reader checks all of it and throws `telar::DataError` with the path and
 *  the reason on any deviation, so a damaged download fails loudly instead of
 *  training on zeros. */

#include <telar/core/detail/decl.hpp>
#include <telar/data/dataset.hpp>
#include <telar/data/detail/byte_reader.hpp>
#include <telar/data/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief Magic number of an IDX file of unsigned-byte images: 3 dimensions
 *  (count, rows, columns). */
inline constexpr std::uint32_t idx_images_magic = 0x00000803;

/*! \brief Magic number of an IDX file of unsigned-byte labels: 1 dimension (count). */
inline constexpr std::uint32_t idx_labels_magic = 0x00000801;

/*! \brief The largest payload `read_idx` accepts (16 GiB); a header asking for
 *  more is taken to be corrupt rather than allocated. */
inline constexpr std::uint64_t idx_max_bytes = std::uint64_t(1) << 34;

/*! \brief An unsigned-byte IDX array as read from a file. */
struct IdxArray {
  std::string path;               //!< the file it was read from
  std::uint32_t magic = 0;        //!< the magic number, e.g. `idx_images_magic`
  std::vector<std::size_t> dims;  //!< the dimension sizes, outermost first
  std::vector<std::uint8_t> data; //!< the elements, row-major; as many as the product of `dims`
};

namespace detail {

TELAR_DECL std::string hex32(std::uint32_t v);

TELAR_DECL char const* idx_type_name(unsigned code);

TELAR_DECL std::string idx_magic_meaning(std::uint32_t magic);

inline char const* idx_payload_noun(std::uint32_t magic) {
  return magic == idx_images_magic ? "pixels" : magic == idx_labels_magic ? "labels" : "data";
}

TELAR_DECL std::string dims_string(std::vector<std::size_t> const& dims);

// expected_magic == 0: any unsigned-byte IDX file.
TELAR_DECL IdxArray read_idx_impl(std::string const& path, std::uint32_t expected_magic);

TELAR_DECL std::string find_first_file(std::string const& dir,
                                       std::vector<std::string> const& names);

// The names the files go by: Debian's dataset-fashion-mnist and the upstream
// downloads use "train-images-idx3-ubyte.gz"; unpacked copies drop ".gz";
// some mirrors write "train-images.idx3-ubyte".
TELAR_DECL std::vector<std::string> idx_file_names(std::string const& base);

inline constexpr char const* fashion_mnist_install_hint =
    "install the Debian package dataset-fashion-mnist (it puts the files in "
    "/usr/share/datasets/fashion-mnist) or pass --data DIR";

} // namespace detail

/*! \brief Reads an unsigned-byte IDX file, gzip-compressed or raw.
 *
 *  Compression is recognised by its content (the gzip magic bytes); a file
 *  whose name ends in `.gz` must be gzip. Checks the magic number, every
 *  dimension (positive, at most 2^31-1, product at most `idx_max_bytes`), that
 *  the payload holds exactly the product of the dimensions (neither truncated
 *  nor followed by trailing bytes), and the gzip stream's integrity (its
 *  CRC-32 and length; concatenated gzip members are accepted).
 *  \param path the file
 *  \return the dimensions and the bytes
 *  \throws telar::DataError naming `path` and what is wrong */
inline IdxArray read_idx(std::string const& path) {
  return detail::read_idx_impl(path, 0);
}

/*! \brief Reads an unsigned-byte IDX file and checks its magic number too.
 *  \param path the file
 *  \param expected_magic `idx_images_magic`, `idx_labels_magic` or another
 *         `0x000008NN` (NN dimensions)
 *  \return the dimensions and the bytes
 *  \throws telar::DataError naming `path` and what is wrong, e.g.
 *          "bad magic 0x00000802, expected 0x00000803 (IDX unsigned-byte images): ..." */
TELAR_DECL IdxArray read_idx(std::string const& path, std::uint32_t expected_magic);

/*! \brief Loads an image classification data set from an IDX images file
 *  (count x rows x columns bytes) and an IDX labels file (count bytes).
 *
 *  Pixels become floats in [0, 1] (byte / 255); each image is one row of
 *  `rows * columns` features with `shape = {rows, columns}`.
 *  \param images_path the images file (`..-images-idx3-ubyte[.gz]`)
 *  \param labels_path the labels file (`..-labels-idx1-ubyte[.gz]`)
 *  \param classes the number of classes; every label must be below it
 *  \return the data set, named after `images_path`
 *  \throws telar::DataError if a file is missing or malformed, the counts
 *          differ or a label is out of range
 *  \throws std::invalid_argument if `classes` is not in [1, 256] */
TELAR_DECL Dataset load_idx(std::string const& images_path, std::string const& labels_path,
                            int classes = 10);

/*! \brief Fashion-MNIST: 60000 training and 10000 test images of 28 x 28
 *  pixels in 10 classes. */
struct FashionMnist {
  Dataset train; //!< the 60000 training images
  Dataset test;  //!< the 10000 test images
};

/*! \brief The names of Fashion-MNIST's 10 classes, by label. */
inline constexpr std::array<char const*, 10> fashion_mnist_class_names = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/*! \brief Where Telar looks for Fashion-MNIST when not told: the environment
 *  variable `TELAR_FASHION_MNIST_DIR` if set, else
 *  `/usr/share/datasets/fashion-mnist` (Debian's dataset-fashion-mnist). */
TELAR_DECL std::string default_fashion_mnist_dir();

/*! \brief Whether `dir` holds the four Fashion-MNIST files (it does not read
 *  them), for examples and tests that skip without the data.
 *  \param dir the directory */
TELAR_DECL bool has_fashion_mnist(std::string const& dir = default_fashion_mnist_dir());

namespace detail {

// The path of one of Fashion-MNIST's files in `dir`, or a DataError saying
// what is missing and how to install the data.
TELAR_DECL std::string fashion_mnist_file(std::string const& dir, std::string const& base);

} // namespace detail

/*! \brief How many training samples the Fashion-MNIST in `dir` holds, read
 *  from its labels file alone (60 kB, not the 47 MB of images): a program
 *  checks its flags against the data before it loads it.
 *  \param dir the directory
 *  \throws telar::DataError as load_fashion_mnist does for a missing directory
 *          or a missing or malformed labels file */
inline std::size_t fashion_mnist_train_size(std::string const& dir = default_fashion_mnist_dir()) {
  return read_idx(detail::fashion_mnist_file(dir, "train-labels-idx1-ubyte"), idx_labels_magic)
      .dims[0];
}

/*! \brief Loads Fashion-MNIST from a directory holding
 *  `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
 *  `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each with or
 *  without `.gz` (the dotted `train-images.idx3-ubyte` spelling is accepted
 *  too).
 *  \param dir the directory
 *  \return the training and test sets, named `fashion-mnist/train` and `fashion-mnist/test`
 *  \throws telar::DataError if the directory or a file is missing (saying how
 *          to install the data) or a file is malformed */
TELAR_DECL FashionMnist load_fashion_mnist(std::string const& dir = default_fashion_mnist_dir());

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/data/idx.ipp>
#endif
