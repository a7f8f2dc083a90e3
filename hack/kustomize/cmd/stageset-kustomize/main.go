// Command stageset-kustomize builds kustomizations of a source tree held only in memory.
//
// Usage:
//
//	stageset-kustomize DIR...   < tree.tar
//	stageset-kustomize --version   (the kustomize release it links)
//
// The controller sends the files a stage's build may read as a tar stream on stdin (regular
// files, and directories, which are skipped; names are clean paths relative to the source root).  They are placed under
// /artifact of an in-memory filesystem, and each DIR (relative to the source root) is built
// with kustomize's own library (sigs.k8s.io/kustomize/api/krusty, the engine behind
// `kustomize build`):
//
//   - loads are not restricted to each kustomization's directory (LoadRestrictionsNone, as
//     Flux does), because the filesystem itself holds nothing but the tree: a path that leaves
//     it, absolute or through "..", finds nothing, and no file of the machine is ever visible;
//   - builtin generators and transformers only (no exec, container or Go plugins, no Helm);
//   - no network: every HTTP request fails before it is sent, and the controller runs this
//     program with an empty PATH, so remote bases cannot be cloned either;
//   - the legacy sort order of `kustomize build`, unless a kustomization sets sortOptions.
//
// Output: the YAML of each build in turn, separated by "---" lines.  On failure: the error on
// stderr (paths relative to the source root) and exit status 1; bad input: exit status 2.
package main

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/provenance"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const root = "/artifact"

// refuse is the transport of every HTTP client that does not bring its own: nothing leaves.
type refuse struct{}

func (refuse) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("network access is disabled: %s", req.URL.Redacted())
}

func readTree(in io.Reader) (filesys.FileSystem, error) {
	fs := filesys.MakeFsInMemory()
	if err := fs.MkdirAll(root); err != nil {
		return nil, err
	}
	archive := tar.NewReader(bufio.NewReader(in))
	for {
		header, err := archive.Next()
		if errors.Is(err, io.EOF) {
			return fs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the tree: %w", err)
		}
		if header.Typeflag == tar.TypeDir {
			continue // directories exist through their files
		}
		if header.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("tree entry %q is not a regular file", header.Name)
		}
		name := header.Name
		if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == ".." ||
			strings.HasPrefix(name, "../") {
			return nil, fmt.Errorf("tree entry %q is not a clean relative path", name)
		}
		content, err := io.ReadAll(archive)
		if err != nil {
			return nil, fmt.Errorf("reading %q: %w", name, err)
		}
		if err := fs.WriteFile(path.Join(root, name), content); err != nil {
			return nil, fmt.Errorf("storing %q: %w", name, err)
		}
	}
}

func build(fs filesys.FileSystem, dir string) (out []byte, err error) {
	// kustomize can panic on malformed objects; that is a failed build, not a crash.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kustomize failed unexpectedly: %v", r)
		}
	}()
	options := krusty.MakeDefaultOptions()
	options.LoadRestrictions = types.LoadRestrictionsNone
	options.PluginConfig = types.DisabledPluginConfig()
	options.Reorder = krusty.ReorderOptionLegacy
	resources, err := krusty.MakeKustomizer(options).Run(fs, path.Join(root, dir))
	if err != nil {
		return nil, err
	}
	return resources.AsYaml()
}

func relative(message string) string {
	return strings.ReplaceAll(strings.ReplaceAll(message, root+"/", ""), root, ".")
}

func main() {
	http.DefaultTransport = refuse{}
	dirs := os.Args[1:]
	if len(dirs) == 1 && dirs[0] == "--version" {
		fmt.Println(provenance.GetProvenance().Version)
		return
	}
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "usage: stageset-kustomize DIR... < tree.tar")
		os.Exit(2)
	}
	fs, err := readTree(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	stdout := bufio.NewWriter(os.Stdout)
	for i, dir := range dirs {
		clean := path.Clean(dir)
		if strings.HasPrefix(clean, "/") || clean == ".." || strings.HasPrefix(clean, "../") {
			fmt.Fprintf(os.Stderr, "build directory %q is not a clean relative path\n", dir)
			os.Exit(2)
		}
		out, err := build(fs, clean)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %s\n", clean, relative(err.Error()))
			os.Exit(1)
		}
		if i > 0 {
			stdout.WriteString("---\n")
		}
		stdout.Write(out)
	}
	if err := stdout.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
