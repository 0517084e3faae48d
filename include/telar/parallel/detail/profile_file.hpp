#pragma once
// Replacing a profile file whole (telar::save_machine_profile): written under
// a temporary name in its directory, then renamed over it, so that a run
// reading it at the same moment (ctest in parallel, another example) reads
// the old profile or the new one, never half of one (which would not parse).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace telar::detail {

// Where a write to `path` lands: the target of a symbolic link (a rename
// would replace the link itself).
inline std::filesystem::path written_path(std::string const& path) {
  std::error_code ec;
  std::filesystem::path const p(path);
  if (std::filesystem::is_symlink(p, ec)) {
    auto target = std::filesystem::canonical(p, ec);
    if (!ec)
      return target;
  }
  return p;
}

// Whether nobody may write the file at `path` (`chmod a-w`): the user's way
// to pin a profile, honoured for root too (whom access() lets write it).
inline bool write_protected(std::filesystem::path const& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto const st = fs::status(path, ec);
  auto const write = fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write;
  return !ec && fs::exists(st) && (st.permissions() & write) == fs::perms::none;
}

// Replaces the file at `path` by `text`: "" when done, else why not (the
// file is then unchanged).
inline std::string replace_file(std::string const& path, std::string const& text) {
  namespace fs = std::filesystem;
  fs::path const target = written_path(path);
  std::error_code ec;
  bool const exists = fs::exists(target, ec);
  // A rename needs only the directory's permission: refuse what an in-place
  // write would, and what the user protected.
  if (exists && write_protected(target))
    return "read-only";
  if (exists && ::access(target.c_str(), W_OK) != 0)
    return "not writable";
  fs::path const tmp = target.string() + ".tmp." + std::to_string(::getpid());
  std::ofstream out(tmp);
  out << text;
  out.close();
  if (!out) {
    fs::remove(tmp, ec);
    return "cannot write " + tmp.string();
  }
  if (exists) // keep its mode
    fs::permissions(tmp, fs::status(target, ec).permissions(), ec);
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return "cannot rename " + tmp.string() + ": " + ec.message();
  }
  return {};
}

} // namespace telar::detail
