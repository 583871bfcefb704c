#pragma once
// Data for the training program: Fashion-MNIST from its gzipped IDX files (Debian's
// dataset-fashion-mnist installs them under /usr/share/datasets/fashion-mnist), or a GENERATED
// stand-in of the same shape (Gaussian clusters, one per class) where the real files are not to be had.

#include <zlib.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace towerpipe_examples {

struct labelled_images {
  std::vector<float> images;         // examples x features, row-major, scaled to [0, 1]
  std::vector<std::int32_t> labels;  // class per example
  std::size_t features = 0;
  std::size_t examples() const { return labels.size(); }
};

struct image_dataset {
  labelled_images train, test;
  std::string description;
};

namespace detail {

inline std::string read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  std::string bytes;
  char buffer[1 << 16];
  for (int n; (n = gzread(file, buffer, sizeof buffer)) > 0;) bytes.append(buffer, static_cast<std::size_t>(n));
  const bool failed = gzeof(file) == 0;
  gzclose(file);
  if (failed) throw std::runtime_error(path + " is not a readable gzip file");
  return bytes;
}

inline std::uint32_t big_endian(const std::string& bytes, std::size_t offset) {
  if (offset + 4 > bytes.size()) throw std::runtime_error("IDX header cut short");
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return value;
}

// IDX: magic 0x00000803 (images: count, rows, columns) or 0x00000801 (labels: count), then bytes.
inline labelled_images read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const std::string images = read_gzip(images_path), labels = read_gzip(labels_path);
  if (big_endian(images, 0) != 0x803) throw std::runtime_error(images_path + ": not an IDX image file");
  if (big_endian(labels, 0) != 0x801) throw std::runtime_error(labels_path + ": not an IDX label file");
  const std::size_t count = big_endian(images, 4), features = std::size_t(big_endian(images, 8)) * big_endian(images, 12);
  if (big_endian(labels, 4) != count) throw std::runtime_error(labels_path + ": label count differs from the images'");
  if (images.size() != 16 + count * features || labels.size() != 8 + count)
    throw std::runtime_error(images_path + ": size does not match its header");
  labelled_images set;
  set.features = features;
  set.images.resize(count * features);
  set.labels.resize(count);
  for (std::size_t i = 0; i < count * features; ++i)
    set.images[i] = static_cast<float>(static_cast<unsigned char>(images[16 + i])) / 255.0f;
  for (std::size_t i = 0; i < count; ++i) set.labels[i] = static_cast<unsigned char>(labels[8 + i]);
  return set;
}

}  // namespace detail

inline image_dataset load_fashion_mnist(const std::string& directory) {
  image_dataset data;
  data.train = detail::read_idx_pair(directory + "/train-images-idx3-ubyte.gz", directory + "/train-labels-idx1-ubyte.gz");
  data.test = detail::read_idx_pair(directory + "/t10k-images-idx3-ubyte.gz", directory + "/t10k-labels-idx1-ubyte.gz");
  data.description = "Fashion-MNIST from " + directory;
  return data;
}

// GENERATED: `classes` Gaussian clusters in `features` dimensions, centres and examples from `seed`.
inline image_dataset generate_clusters(std::size_t train, std::size_t test, std::size_t features, std::size_t classes,
                                       std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> centre(0.5f, 0.15f), noise(0.0f, 0.35f);
  std::vector<float> centres(classes * features);
  for (float& c : centres) c = centre(rng);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(classes) - 1);
  const auto draw = [&](std::size_t count) {
    labelled_images set;
    set.features = features;
    set.images.resize(count * features);
    set.labels.resize(count);
    for (std::size_t e = 0; e < count; ++e) {
      set.labels[e] = pick(rng);
      for (std::size_t f = 0; f < features; ++f)
        set.images[e * features + f] = centres[static_cast<std::size_t>(set.labels[e]) * features + f] + noise(rng);
    }
    return set;
  };
  image_dataset data;
  data.train = draw(train);
  data.test = draw(test);
  data.description = "GENERATED Gaussian clusters (" + std::to_string(classes) + " classes, " + std::to_string(features) +
                     " features; not Fashion-MNIST)";
  return data;
}

}  // namespace towerpipe_examples
